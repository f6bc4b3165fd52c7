// Command ociimage writes an OCI image archive of one layer, the folder
// given, for `ctr image import`: the test cluster reaches no registry, so
// its images (the pause program, the guard with the simulator) are made
// here from files built here.
//
//	ociimage -root DIR -name localhost/pause:v1 -config '{"Entrypoint":["/pause"]}' -o pause.tar
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	root := flag.String("root", "", "the folder that becomes the image's file system")
	name := flag.String("name", "", "the image's name, e.g. localhost/vllm-guard:test")
	config := flag.String("config", "{}", "the image's run configuration (Entrypoint, Cmd, Env) as JSON")
	out := flag.String("o", "", "the archive to write")
	flag.Parse()
	if *root == "" || *name == "" || *out == "" || !strings.Contains(*name, ":") {
		log.Fatal("ociimage: give -root, -name (with a :tag) and -o")
	}
	var run map[string]any
	if err := json.Unmarshal([]byte(*config), &run); err != nil {
		log.Fatalf("ociimage: -config is not a JSON object: %v", err)
	}
	layer, err := layerOf(*root)
	if err != nil {
		log.Fatalf("ociimage: %v", err)
	}
	blobs := map[string][]byte{}
	put := func(b []byte) (string, int) {
		s := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(s[:])
		blobs[d] = b
		return d, len(b)
	}
	ld, ln := put(layer)
	cfg, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "config": run,
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{ld}}})
	cd, cn := put(cfg)
	man, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": ln}}})
	md, mn := put(man)
	tag := (*name)[strings.LastIndex(*name, ":")+1:]
	idx, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{map[string]any{
		"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": mn,
		"annotations": map[string]string{"io.containerd.image.name": *name, "org.opencontainers.image.ref.name": tag}}}})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(n string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", idx)
	for d, b := range blobs {
		add("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), b)
	}
	if err := tw.Close(); err != nil {
		log.Fatalf("ociimage: %v", err)
	}
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		log.Fatalf("ociimage: %v", err)
	}
}

// layerOf is root as an uncompressed tar, owners and modes as they are on
// disk, symbolic links kept as links.
func layerOf(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), tw.Close()
}
