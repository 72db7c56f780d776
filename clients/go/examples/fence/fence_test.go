package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// The holder child is this test binary re-executed with the env below.
const childEnv = "RINGLOCK_FENCE_EXAMPLE_HOLDER"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(holdMain(os.Args[1:], os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

func story(t *testing.T, fence bool) (outcome, *Store) {
	srv, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill9()
	path := filepath.Join(t.TempDir(), "store")
	out, err := demo(demoOptions{
		addr: srv.Lock, ttl: 300 * time.Millisecond, fence: fence, file: path,
		holder: func(args ...string) *exec.Cmd {
			c := exec.Command(os.Args[0], args...)
			c.Env = append(os.Environ(), childEnv+"=1")
			return c
		},
		say: func(s string) { t.Log(s) },
	})
	if err != nil {
		t.Fatalf("%v (holder A said %q)", err, out.holderSaid)
	}
	if out.tokenB <= out.tokenA {
		t.Fatalf("B's token %d not larger than A's %d", out.tokenB, out.tokenA)
	}
	return out, &Store{Path: path}
}

// A Go lease holder stopped past its TTL resumes and writes with its old
// token: the store refuses it, and B's write is the last one.
func TestAPausedHoldersStaleWriteIsRefused(t *testing.T) {
	out, store := story(t, true)
	if !out.staleRefused {
		t.Fatalf("the stale write was applied: %q", out.holderSaid)
	}
	highest, lines, err := store.Contents()
	if err != nil {
		t.Fatal(err)
	}
	if highest != out.tokenB || len(lines) != 2 || !strings.HasSuffix(lines[1], "B's write") {
		t.Fatalf("store: highest %d, writes %q; want B's token %d last", highest, lines, out.tokenB)
	}
}

// Without the fence the same story corrupts the store: A's stale write
// lands after B's. This proves the test above sees the failure it guards
// against.
func TestWithoutTheFenceTheStaleWriteLands(t *testing.T) {
	out, store := story(t, false)
	if out.staleRefused {
		t.Fatalf("refused without a fence: %q", out.holderSaid)
	}
	_, lines, err := store.Contents()
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 3 || !strings.HasSuffix(lines[2], "A's write after the pause") {
		t.Fatalf("store writes %q; want A's stale write last", lines)
	}
}

func TestStoreRefusesLowerTokensAndChangesNothing(t *testing.T) {
	s := &Store{Path: filepath.Join(t.TempDir(), "store")}
	for _, tok := range []uint64{5, 5, 9} {
		if err := s.Write(tok, "w"); err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	before, _ := os.ReadFile(s.Path)
	var stale *StaleError
	if err := s.Write(7, "late"); !errors.As(err, &stale) || stale.Seen != 9 || stale.Got != 7 {
		t.Fatalf("token 7 after 9: %v", err)
	}
	after, _ := os.ReadFile(s.Path)
	if string(before) != string(after) {
		t.Fatalf("a refused write changed the store:\n%s\n->\n%s", before, after)
	}
	if err := os.WriteFile(s.Path, []byte("not a store\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(10, "x"); err == nil {
		t.Fatal("a file that is not a store was written to")
	}
}
