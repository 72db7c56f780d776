// Package testserver starts the real ringlockd binary on ephemeral
// loopback ports for the Go client's tests, and reads its admin port and
// metrics. It is internal: not part of the client's API.
package testserver

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Server is one running ringlockd.
type Server struct {
	Lock    string // lock port, HOST:PORT
	Admin   string
	Metrics string
	extra   []string
	cmd     *exec.Cmd
	lines   chan string
}

// Binary is the ringlockd to run: $RINGLOCKD, or target/debug/ringlockd
// of the repository this package is checked out in.
func Binary() (string, error) {
	if b := os.Getenv("RINGLOCKD"); b != "" {
		return filepath.Abs(b)
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "target", "debug", "ringlockd")
		if _, err := os.Stat(filepath.Join(dir, "Cargo.toml")); err == nil {
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%s missing: run `cargo build --bin ringlockd` in %s, or set RINGLOCKD", p, dir)
			}
			return p, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no ringlockd: set RINGLOCKD (no Cargo.toml above the working directory)")
		}
		dir = up
	}
}

// CLI is the ringlock command (its `ringlock cert` makes the TLS tests'
// certificates): $RINGLOCK_CLI, or the ringlock beside Binary().
func CLI() (string, error) {
	if b := os.Getenv("RINGLOCK_CLI"); b != "" {
		return filepath.Abs(b)
	}
	d, err := Binary()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(d), "ringlock")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s missing: run `cargo build --bins`, or set RINGLOCK_CLI", p)
	}
	return p, nil
}

// Threads is --threads from $RINGLOCK_TEST_THREADS (default 1).
func Threads() string {
	if n := os.Getenv("RINGLOCK_TEST_THREADS"); n != "" {
		return n
	}
	return "1"
}

// Start runs ringlockd on 127.0.0.1 with free ports, --threads from the
// environment and extra arguments, and waits (bounded) for its listening
// line.
func Start(extra ...string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	args := append([]string{"--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0",
		"--metrics-bind", "127.0.0.1:0", "--threads", Threads()}, extra...)
	s := &Server{extra: extra}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = nil
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s.cmd = cmd
	s.lines = make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case s.lines <- sc.Text():
			default: // nobody reads the log after start-up; drop it
			}
		}
		close(s.lines)
	}()
	var seen []string
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				_ = cmd.Wait()
				return nil, fmt.Errorf("ringlockd exited before listening: %s", strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			if strings.Contains(l, "event=listening") {
				s.Lock, s.Admin, s.Metrics = field(l, "lock"), field(l, "admin"), field(l, "metrics")
				return s, nil
			}
		case <-timeout:
			s.Kill9()
			return nil, fmt.Errorf("ringlockd did not listen within 20 s: %s", strings.Join(seen, "\n"))
		}
	}
}

func field(line, name string) string {
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, name+"=") {
			return f[len(name)+1:]
		}
	}
	return ""
}

// Kill9 kills the server with SIGKILL and reaps it.
func (s *Server) Kill9() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		_ = s.cmd.Wait()
	}
}

// Restart kill -9s the server and starts it again with the same
// arguments (a durable server's --data-path included) on new free ports.
func (s *Server) Restart() (*Server, error) {
	s.Kill9()
	return Start(s.extra...)
}

// Metric reads one unlabelled series from /metrics.
func (s *Server) Metric(name string) (float64, error) {
	c, err := net.DialTimeout("tcp", s.Metrics, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"); err != nil {
		return 0, err
	}
	text, err := io.ReadAll(c)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(l, name+" ") {
			return strconv.ParseFloat(strings.TrimSpace(l[len(name)+1:]), 64)
		}
	}
	return 0, fmt.Errorf("no series %s in /metrics", name)
}

// WaitMetric polls /metrics until name reads want: the event loops publish
// their gauges once per tick, so this is the signal that a request reached
// a state (queued, withdrawn). Bounded: 20 s.
func (s *Server) WaitMetric(name string, want float64) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := s.Metric(name)
		if err == nil && v == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never reached %v (now %v, %v)", name, want, v, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Held is one key of the admin command KEYX.
type Held struct {
	Key, Source, Endpoint string
	Token                 uint64
	Mode                  uint8 // 0 persistent, 1 session, 2 lease
	LeaseMsLeft           uint32
}

// Keyx lists the held keys through the admin port.
func (s *Server) Keyx() (map[string]Held, error) {
	c, err := net.DialTimeout("tcp", s.Admin, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "KEYX"); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return nil, err
	}
	name := func() (string, error) {
		l, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		b := make([]byte, l)
		_, err = io.ReadFull(r, b)
		return string(b), err
	}
	out := make(map[string]Held, n)
	for i := uint32(0); i < n; i++ {
		var h Held
		var acquired int64
		var err error
		if h.Key, err = name(); err != nil {
			return nil, err
		}
		if h.Source, err = name(); err != nil {
			return nil, err
		}
		if h.Endpoint, err = name(); err != nil {
			return nil, err
		}
		for _, v := range []interface{}{&acquired, &h.Token, &h.Mode, &h.LeaseMsLeft} {
			if err := binary.Read(r, binary.LittleEndian, v); err != nil {
				return nil, err
			}
		}
		out[h.Key] = h
	}
	return out, nil
}

// Reset resets keys through the admin command RSET (an operator reset:
// a live session holder is pushed Lost).
func (s *Server) Reset(keys ...string) error {
	c, err := net.DialTimeout("tcp", s.Admin, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := []byte("RSET")
	req = binary.LittleEndian.AppendUint32(req, uint32(len(keys)))
	for _, k := range keys {
		req = append(append(req, byte(len(k))), k...)
	}
	if _, err := c.Write(req); err != nil {
		return err
	}
	ans := make([]byte, len(keys)+1)
	if _, err := io.ReadFull(c, ans); err != nil {
		return err
	}
	for _, b := range ans {
		if b != '+' {
			return fmt.Errorf("RSET answered %q", ans)
		}
	}
	return nil
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }
