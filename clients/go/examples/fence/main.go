// Command fence plays the classic failure of a lock without fencing, and
// the fence that prevents it, against a real ringlockd, with the Go client.
//
//	ringlockd &                          # lock port 127.0.0.1:22119
//	go run ./examples/fence              # or -addr HOST:PORT, or RINGLOCK_ADDR
//	go run ./examples/fence -no-fence    # the same story, unprotected
//
// The protected resource is a file (Store) holding the highest fencing
// token it has accepted; every write checks its token against it and
// writes under flock(2). The story:
//  1. Holder A, a child process (this program, `fence hold`), takes a lease
//     (TTL -ttl, default 300 ms) that extends itself every third of its TTL
//     (WithAutoExtend) and writes once with its token: accepted.
//  2. A checks that its lease is alive (an Extend answered ok) and is about
//     to write again. Right then it is stopped with SIGSTOP: a pause (a
//     stop-the-world collection, a swapped-out page, a VM migration) that
//     also stops its extend goroutine.
//  3. Holder B (this process) asks for the key; the server grants it when
//     A's lease expires, with a larger token. B writes: accepted.
//  4. A is continued (SIGCONT) and performs the write it had checked for,
//     with its old token: the store refuses it. B's write stands.
//
// Exit status 0: the stale write was refused; 1: it was applied (what
// -no-fence shows); 2: anything else failed.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	ringlock "github.com/ringlock/ringlock/clients/go"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hold" {
		os.Exit(holdMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("fence", flag.ExitOnError)
	addr := fs.String("addr", envOr("RINGLOCK_ADDR", "127.0.0.1:22119"), "ringlockd's lock port")
	ttl := fs.Duration("ttl", 300*time.Millisecond, "holder A's lease TTL (within the server's bounds)")
	noFence := fs.Bool("no-fence", false, "let the store apply every write")
	file := fs.String("file", "", "the store's file (default: a new temporary file)")
	_ = fs.Parse(args)
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fence:", err)
		return 2
	}
	path := *file
	if path == "" {
		dir, err := os.MkdirTemp("", "ringlock-fence-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "fence:", err)
			return 2
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "store")
	}
	out, err := demo(demoOptions{
		addr: *addr, ttl: *ttl, fence: !*noFence, file: path,
		holder: func(args ...string) *exec.Cmd { return exec.Command(self, append([]string{"hold"}, args...)...) },
		say:    func(s string) { fmt.Println(s) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fence:", err)
		return 2
	}
	if out.staleRefused {
		fmt.Println("the paused holder's stale write was refused: the store is consistent")
		return 0
	}
	fmt.Println("the paused holder's stale write was APPLIED over its successor's (no fence)")
	return 1
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type demoOptions struct {
	addr   string
	ttl    time.Duration
	fence  bool
	file   string
	holder func(args ...string) *exec.Cmd // runs holdMain in a child process
	say    func(string)
}

type outcome struct {
	tokenA, tokenB uint64
	staleRefused   bool
	holderSaid     []string
}

// demo runs the story; every step is bounded, so a hung server fails it.
func demo(o demoOptions) (outcome, error) {
	var out outcome
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	key := fmt.Sprintf("fence-example-go/%d", os.Getpid())
	args := []string{"-addr", o.addr, "-key", key, "-file", o.file, "-ttl", o.ttl.String()}
	if !o.fence {
		args = append(args, "-no-fence")
	}
	cmd := o.holder(args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return out, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return out, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return out, err
	}
	defer func() {
		// Whatever happened, never leave a stopped child behind.
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(prefix string) (string, error) {
		select {
		case l, ok := <-lines:
			if !ok {
				return "", fmt.Errorf("holder A exited before saying %q", prefix)
			}
			out.holderSaid = append(out.holderSaid, l)
			if !strings.HasPrefix(l, prefix) {
				return "", fmt.Errorf("holder A said %q, expected %q", l, prefix)
			}
			return l, nil
		case <-ctx.Done():
			return "", fmt.Errorf("holder A did not say %q in time", prefix)
		}
	}
	l, err := expect("wrote ")
	if err != nil {
		return out, err
	}
	if _, err := fmt.Sscanf(l, "wrote %d", &out.tokenA); err != nil {
		return out, fmt.Errorf("holder A: %q", l)
	}
	o.say(fmt.Sprintf("A holds %s with token %d and wrote: accepted", key, out.tokenA))
	if _, err := expect("checked"); err != nil {
		return out, err
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return out, err
	}
	o.say("A checked its lease and was stopped (SIGSTOP) before its second write")

	s, err := ringlock.Dial(ctx, []string{o.addr}, ringlock.WithSource("fence-example-B"))
	if err != nil {
		return out, err
	}
	defer s.Close()
	b, err := s.Acquire(ctx, key, ringlock.WithTTL(30*time.Second), ringlock.WithWait(30*time.Second))
	if err != nil {
		return out, fmt.Errorf("B: %w", err)
	}
	defer b.Release(context.Background())
	out.tokenB = b.Token()
	store := Store{Path: o.file, Unfenced: !o.fence}
	if err := store.Write(b.Token(), "B's write"); err != nil {
		return out, fmt.Errorf("B's write: %w", err)
	}
	o.say(fmt.Sprintf("A's lease expired; B was granted token %d and wrote: accepted", out.tokenB))

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return out, err
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return out, err
	}
	l, err = expect("stale write ")
	if err != nil {
		return out, err
	}
	out.staleRefused = strings.HasPrefix(l, "stale write refused")
	o.say("A continued (SIGCONT) and wrote with token " + fmt.Sprint(out.tokenA) + ": " + strings.TrimPrefix(l, "stale write "))
	if l, err := expect("lost "); err == nil {
		o.say("A then learned: " + strings.TrimPrefix(l, "lost "))
	} else {
		return out, err
	}
	if err := cmd.Wait(); err != nil {
		return out, fmt.Errorf("holder A: %v", err)
	}
	return out, nil
}

// holdMain is holder A. It says, one line each: "wrote TOKEN" after its
// first write, "checked" once an Extend proved the lease alive, then waits
// for a line on stdin (the pause happens here, between its check and its
// write), writes again and says "stale write refused: ..." or "stale write
// applied", and finally "lost REASON" once it learns the lease is gone.
func holdMain(args []string, stdin io.Reader, stdout io.Writer) int {
	fs := flag.NewFlagSet("fence hold", flag.ContinueOnError)
	addr := fs.String("addr", "", "")
	key := fs.String("key", "", "")
	file := fs.String("file", "", "")
	ttl := fs.Duration("ttl", 300*time.Millisecond, "")
	noFence := fs.Bool("no-fence", false, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(what string, err error) int {
		fmt.Fprintf(stdout, "error %s: %v\n", what, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := ringlock.Dial(ctx, []string{*addr}, ringlock.WithSource("fence-example-A"))
	if err != nil {
		return fail("dial", err)
	}
	defer s.Close()
	lo, hi := s.TTLBounds()
	if *ttl < lo {
		*ttl = lo
	} else if *ttl > hi {
		*ttl = hi
	}
	lease, err := s.Acquire(ctx, *key, ringlock.WithTTL(ttl.Round(time.Millisecond)), ringlock.WithAutoExtend())
	if err != nil {
		return fail("acquire", err)
	}
	store := Store{Path: *file, Unfenced: *noFence}
	if err := store.Write(lease.Token(), "A's first write"); err != nil {
		return fail("first write", err)
	}
	fmt.Fprintf(stdout, "wrote %d\n", lease.Token())
	if err := lease.Extend(ctx); err != nil {
		return fail("check", err)
	}
	fmt.Fprintln(stdout, "checked")
	if _, err := bufio.NewReader(stdin).ReadString('\n'); err != nil {
		return fail("waiting for the go-ahead", err)
	}
	// The write A had checked for, with the token it holds.
	err = store.Write(lease.Token(), "A's write after the pause")
	var stale *StaleError
	switch {
	case errors.As(err, &stale):
		fmt.Fprintf(stdout, "stale write refused: %v\n", err)
	case err != nil:
		return fail("second write", err)
	default:
		fmt.Fprintln(stdout, "stale write applied")
	}
	select {
	case <-lease.Lost():
		fmt.Fprintf(stdout, "lost %v\n", lease.Err())
	case <-ctx.Done():
		return fail("waiting for the loss", ctx.Err())
	}
	return 0
}
