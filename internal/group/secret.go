package group

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// maxSecret bounds what is read of the secret file (a key, not a log).
const maxSecret = 4096

// ReadSecret reads the group's shared secret from path ([group]
// secret_file: a mounted Kubernetes Secret, a file only root reads): its
// bytes without surrounding whitespace (the newline an editor or
// `kubectl create secret --from-file` leaves), at least MinSecret of them.
func ReadSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("group: cannot read the secret file: %w; write the group's shared secret (the same on every host) there, or fix [group] secret_file", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecret+1))
	if err != nil {
		return nil, fmt.Errorf("group: cannot read the secret file %s: %w", path, err)
	}
	if len(b) > maxSecret {
		return nil, fmt.Errorf("group: the secret file %s is larger than %d bytes: is [group] secret_file the right file?", path, maxSecret)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinSecret {
		return nil, fmt.Errorf("group: the secret in %s has %d bytes; write at least %d random ones, the same on every host (such as the output of `head -c 32 /dev/urandom | base64`)", path, len(b), MinSecret)
	}
	return b, nil
}
