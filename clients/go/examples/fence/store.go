package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Store is the protected resource: one file. Its first line is the
// highest fencing token it has accepted (`highest N`), every further line
// one accepted write, in order. Write checks the token and writes under an
// exclusive flock(2) of the file, so the check and the write are one step
// for every process that writes through a Store, and the mark lives as
// long as the data (a restarted writer cannot forget it).
type Store struct {
	Path string
	// Unfenced skips the check: every write lands (to show the failure).
	Unfenced bool
}

// StaleError is a write refused because its token is lower than the
// highest the store has accepted.
type StaleError struct{ Seen, Got uint64 }

func (e *StaleError) Error() string {
	return fmt.Sprintf("stale fencing token %d: the store has accepted %d", e.Got, e.Seen)
}

// Write appends line if token is at least the highest accepted so far (an
// equal token is the same holder writing again) and raises the mark. A
// refused write changes nothing and returns a *StaleError.
func (s *Store) Write(token uint64, line string) error {
	if strings.ContainsRune(line, '\n') {
		return errors.New("a write is one line")
	}
	f, err := os.OpenFile(s.Path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close() // also drops the flock
	// Held from the read of the mark to the end of the write: another
	// writer's check cannot slip in between.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("flock %s: %w", s.Path, err)
	}
	highest, lines, err := read(f)
	if err != nil {
		return err
	}
	if token < highest && !s.Unfenced {
		return &StaleError{Seen: highest, Got: token}
	}
	if token > highest {
		highest = token
	}
	lines = append(lines, fmt.Sprintf("%d %s", token, line))
	body := fmt.Sprintf("highest %d\n%s\n", highest, strings.Join(lines, "\n"))
	if _, err := f.WriteAt([]byte(body), 0); err != nil {
		return err
	}
	if err := f.Truncate(int64(len(body))); err != nil {
		return err
	}
	return f.Sync()
}

// Contents returns the mark and the accepted writes ("TOKEN LINE").
func (s *Store) Contents() (highest uint64, lines []string, err error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		return 0, nil, err
	}
	return read(f)
}

func read(f *os.File) (uint64, []string, error) {
	if _, err := f.Seek(0, 0); err != nil {
		return 0, nil, err
	}
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, nil, sc.Err() // a new, empty store
	}
	first := sc.Text()
	if !strings.HasPrefix(first, "highest ") {
		return 0, nil, fmt.Errorf("%s is not a fenced store (first line %q)", f.Name(), first)
	}
	highest, err := strconv.ParseUint(strings.TrimPrefix(first, "highest "), 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %v", f.Name(), err)
	}
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return highest, lines, sc.Err()
}
