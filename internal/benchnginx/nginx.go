// Package benchnginx is the nginx the benchmarks set beside the guard's
// proxy: one reverse-proxy configuration (keep-alive to the upstream,
// streams passed through unbuffered, no access log), so that the proxy
// benchmark and bench-admission measure the same nginx, and the two differ
// only in limit_conn.
package benchnginx

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Find returns nginx from PATH, else Debian's /usr/sbin/nginx.
func Find() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/nginx"
	if _, err := os.Stat(debian); err != nil {
		return "", fmt.Errorf("nginx is not installed: install Debian's nginx-light (apt-get install -y nginx-light; make bench does)")
	}
	return debian, nil
}

// Write puts nginx.conf into dir (nginx's prefix: pid, logs and temporary
// files stay there): listen on listen, proxy to upstream (host:port), and
// with limitConn > 0 at most that many connections at once for the whole
// server, the rest refused with nginx's default 503. It returns the
// command that runs nginx in the foreground on it.
func Write(bin, dir, upstream, listen string, limitConn int) (*exec.Cmd, error) {
	return WriteWith(bin, dir, upstream, listen, limitConn, "", "")
}

// WriteWith is Write with more directives: server's after the upstream's
// address (e.g. "max_fails=0"), location's inside the location (e.g.
// make bench-resume's proxy_next_upstream, nginx's retry).
func WriteWith(bin, dir, upstream, listen string, limitConn int, server, location string) (*exec.Cmd, error) {
	zone, limit := "", ""
	if limitConn > 0 {
		zone = "limit_conn_zone $server_name zone=vllm:1m;"
		limit = fmt.Sprintf("limit_conn vllm %d;", limitConn)
	}
	conf := fmt.Sprintf(`worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    %[4]s
    upstream vllm { server %[2]s %[6]s; keepalive 64; }
    server {
        listen %[3]s;
        location / {
            %[5]s
            %[7]s
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }
    }
}
`, dir, upstream, listen, zone, limit, server, location)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", path, "-g", "daemon off;"), nil
}
