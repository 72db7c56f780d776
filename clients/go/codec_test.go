package ringlock

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The example frame of docs/protocol.md ("Sessions"): a session Acquire of
// key k, rid 1, no wait, empty source.
func TestEncodeAcquireMatchesTheProtocolDocument(t *testing.T) {
	got := encodeAcquire(1, HoldSession, 0, 0, "k", "", Exclusive)
	want := unhex(t, "08 01 00 00 00 0c 00 01 00 00 00 00 00 00 00 00 01 6b 00")
	if !bytes.Equal(got, want) {
		t.Fatalf("got % x\nwant % x", got, want)
	}
}

func TestEncodeEveryRequest(t *testing.T) {
	cases := []struct {
		name string
		got  []byte
		want string
	}{
		{"hello without auth", encodeHello(1, 1, 3000, nil), "07 01000000 0500 01 b80b0000"},
		{"hello with auth", encodeHello(1, 1, 0, []byte("ab")), "07 01000000 0800 01 00000000 02 6162"},
		{"lease acquire, waits forever, with source", encodeAcquire(0x01020304, HoldLease, 1000, waitForever, "ab", "s", Exclusive),
			"08 04030201 0e00 02 e8030000 ffffffff 02 6162 01 73"},
		{"release", encodeRelease(9, 0x0102030405060708, "k"), "09 09000000 0a00 0807060504030201 01 6b"},
		{"extend", encodeExtend(10, 7, 250, "k"), "0a 0a000000 0e00 0700000000000000 fa000000 01 6b"},
		{"cancel", encodeCancel(11, 5, "k"), "0b 0b000000 0600 05000000 01 6b"},
		{"ping", encodePing(12), "0c 0c000000 0000"},
		{"proclaim", encodeProclaim(17, 0x0102030405060708, "k", "v2"), "11 11000000 0d00 0807060504030201 01 6b 02 7632"},
		{"proclaim, an empty source", encodeProclaim(0, 9, "elect", ""), "11 00000000 0f00 0900000000000000 05 656c656374 00"},
		{"shared acquire: the access trailer, slots 0", encodeAcquire(1, HoldSession, 0, 0, "k", "", Shared),
			"08 01000000 1100 01 00000000 00000000 01 6b 00 01 00000000"},
		{"semaphore of 3, a lease", encodeAcquire(7, HoldLease, 30000, waitForever, "pool", "w1", Semaphore(3)),
			"08 07000000 1600 02 30750000 ffffffff 04 706f6f6c 02 7731 02 03000000"},
	}
	for _, c := range cases {
		if want := unhex(t, c.want); !bytes.Equal(c.got, want) {
			t.Errorf("%s: got % x\nwant % x", c.name, c.got, want)
		}
	}
}

func TestBodyLengthCountsTheLongestKeyAndSource(t *testing.T) {
	key, src := strings.Repeat("k", MaxKeyLen), strings.Repeat("s", MaxSourceLen)
	b := encodeAcquire(2, HoldSession, 0, 0, key, src, Exclusive)
	if n := int(b[5]) | int(b[6])<<8; n != len(b)-headerLen || n != 11+MaxKeyLen+MaxSourceLen {
		t.Fatalf("body length %d, frame %d bytes", n, len(b))
	}
	b = encodeAcquire(2, HoldSession, 0, 0, key, src, Semaphore(1<<31))
	if n := int(b[5]) | int(b[6])<<8; n != len(b)-headerLen || n != 16+MaxKeyLen+MaxSourceLen || n > bodyMax {
		t.Fatalf("body length %d with the trailer, frame %d bytes", n, len(b))
	}
}

func TestDecodeWelcome(t *testing.T) {
	body := unhex(t, "00 01 10270000 0a000000 005c2605 2a00000000000000 a0860100 a0860100 0200")
	w, err := decodeWelcome(body) // a 32-byte welcome: flags 0
	if err != nil {
		t.Fatal(err)
	}
	want := welcome{status: StatusOK, version: 1, keepaliveMs: 10000, minTTLMs: 10, maxTTLMs: 86400000,
		sessionID: 42, maxKeys: 100000, maxWaiters: 100000, shards: 2}
	if w != want {
		t.Fatalf("got %+v\nwant %+v", w, want)
	}
	w, err = decodeWelcome(append(append([]byte{}, body...), flagResumable, 0xEE)) // flags, then skipped
	want.flags = flagResumable
	if err != nil || w != want {
		t.Fatalf("got %+v %v\nwant %+v", w, err, want)
	}
	if _, err := decodeWelcome(body[:31]); err == nil {
		t.Fatal("a 31-byte Hello reply decoded")
	}
}

func TestDecodeReply(t *testing.T) {
	r, err := decodeReply(unhex(t, "04 0807060504030201 ffffffff"))
	if err != nil {
		t.Fatal(err)
	}
	if r.status != StatusStaleToken || r.token != 0x0102030405060708 || r.ttlLeftMs != noTTL {
		t.Fatalf("got %+v", r)
	}
	for _, bad := range []string{"00 0000000000000000 000000", "00 0000000000000000 0000000000", "0b 0000000000000000 00000000"} {
		if _, err := decodeReply(unhex(t, bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}

// Statuses with detail have their own layout whatever the request; the
// first example is docs/protocol.md's (a server speaking version 1 only).
func TestDecodeStatusesWithDetail(t *testing.T) {
	r, err := decodeReply(unhex(t, "0b 01 01"))
	if err != nil || r.status != StatusUnsupportedVersion || !bytes.Equal(r.detail, []byte{1}) {
		t.Fatalf("got %+v %v", r, err)
	}
	r, err = decodeReply(append(unhex(t, "0c 0e"), "10.0.0.9:22119"...))
	if err != nil || r.status != StatusNotLeader || string(r.detail) != "10.0.0.9:22119" {
		t.Fatalf("got %+v %v", r, err)
	}
	r, err = decodeReply(unhex(t, "0c 00"))
	if err != nil || r.status != StatusNotLeader || len(r.detail) != 0 {
		t.Fatalf("an empty leader: got %+v %v", r, err)
	}
	for _, bad := range []string{
		"0c",                           // no length
		"0b 02 01",                     // detail shorter than said
		"0b 01 01 02",                  // longer
		"0b 0000000000000000 000000",   // the 13-byte layout
		"",                             // empty
		"10 0000000000000000 00000000", // unknown status
	} {
		if _, err := decodeReply(unhex(t, bad)); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
	if !hasDetail(11) || !hasDetail(12) || hasDetail(10) || hasDetail(0) {
		t.Fatal("hasDetail")
	}
	if StatusUnsupportedVersion.String() != "unsupported_version" || StatusNotLeader.String() != "not_leader" {
		t.Fatal("names")
	}
	r, err = decodeReply(unhex(t, "0e 0000000000000000 ffffffff"))
	if err != nil || r.status != StatusTLSRequired || r.status.String() != "tls_required" || !errors.Is(&StatusError{Op: "hello", Status: r.status}, ErrTLSRequired) {
		t.Fatalf("tls_required: got %+v %v", r, err)
	}
	if got := encodeHello(3, 9, 0, nil)[7]; got != 9 {
		t.Fatalf("hello version byte %d", got)
	}
}

func TestDecodeLost(t *testing.T) {
	p, err := decodeLost(unhex(t, "0500000000000000 01 02 6b31"))
	if err != nil {
		t.Fatal(err)
	}
	if p != (lostPush{token: 5, reason: LostExpired, key: "k1"}) {
		t.Fatalf("got %+v", p)
	}
	for _, bad := range []string{
		"0500000000000000 01 03 6b31", // key length past the body
		"0500000000000000 01 00",      // empty key
		"0500000000000000 07 01 6b",   // unknown reason
		"05000000000000",              // short
	} {
		if _, err := decodeLost(unhex(t, bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}

func TestDecodeHeader(t *testing.T) {
	kind, rid, n, err := decodeHeader(unhex(t, "80 07000000 0d00"))
	if err != nil || kind != kindReply || rid != 7 || n != 13 {
		t.Fatalf("got %x %d %d %v", kind, rid, n, err)
	}
	if _, _, _, err := decodeHeader(unhex(t, "80 07000000 0102")); err == nil {
		t.Fatal("a 513-byte body was accepted")
	}
	if _, _, _, err := decodeHeader(unhex(t, "2b 07000000 0000")); err == nil {
		t.Fatal("a Locking-Center '+' was accepted as an answer kind")
	}
}

func TestStatusNamesAndErrorsIs(t *testing.T) {
	names := map[Status]string{StatusOK: "ok", StatusTimedOut: "timed_out", StatusBusy: "busy",
		StatusNotOwner: "not_owner", StatusStaleToken: "stale_token", StatusInvalid: "invalid",
		StatusLimit: "limit_reached", StatusServerError: "server_error", StatusCancelled: "cancelled",
		StatusNotQueued: "not_queued", StatusUnauthorized: "unauthorized",
		StatusUnsupportedVersion: "unsupported_version", StatusNotLeader: "not_leader",
		StatusUnknownSession: "unknown_session", StatusTLSRequired: "tls_required",
		StatusModeMismatch: "mode_mismatch"}
	if len(names) != len(statusNames) {
		t.Fatalf("%d statuses named, %d tested", len(statusNames), len(names))
	}
	for s := range names {
		if _, ok := statusSentinels[s]; !ok && s != StatusOK {
			t.Errorf("status %s has no sentinel", s)
		}
	}
	for s, n := range names {
		if s.String() != n {
			t.Errorf("status %d is %q, want %q", s, s, n)
		}
	}
	var err error = fmt.Errorf("wrapped: %w", &StatusError{Op: "acquire", Key: "k", Status: StatusBusy})
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrTimedOut) {
		t.Fatal("errors.Is does not match the status sentinel")
	}
	var se *StatusError
	if !errors.As(err, &se) || se.Status != StatusBusy || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("errors.As: %v", err)
	}
	lost := error(&LostError{Key: "k", Token: 3, Reason: LostStaleToken, Status: StatusStaleToken})
	if !errors.Is(lost, ErrLost) || !errors.Is(lost, ErrStaleToken) || errors.Is(lost, ErrNotOwner) {
		t.Fatal("a stale-token loss does not match ErrLost and ErrStaleToken only")
	}
	if errors.Is(&LostError{Reason: LostExpired}, ErrStaleToken) {
		t.Fatal("an expiry matches ErrStaleToken")
	}
}

func TestNormalizeAddr(t *testing.T) {
	ok := map[string]string{
		"127.0.0.1":      "127.0.0.1:22119",
		"host.example":   "host.example:22119",
		"127.0.0.1:9":    "127.0.0.1:9",
		"::1":            "[::1]:22119",
		"[::1]":          "[::1]:22119",
		"[::1]:22200":    "[::1]:22200",
		"localhost:1234": "localhost:1234",
	}
	for in, want := range ok {
		got, err := normalizeAddr(in)
		if err != nil || got != want {
			t.Errorf("%q: got %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "host:0", "host:99999", "host:x", ":80", "[::1"} {
		if got, err := normalizeAddr(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: got %q, %v; want ErrInvalidArgument", bad, got, err)
		}
	}
}

func TestResumeAndHeld(t *testing.T) {
	got := encodeResume(1, 1, 0x0080000000000007, nil)
	if want := unhex(t, "0d 01000000 0900 01 0700000000008000"); !bytes.Equal(got, want) {
		t.Fatalf("resume % x, want % x", got, want)
	}
	if got := encodeResume(1, 1, 7, []byte("s")); !bytes.Equal(got[len(got)-2:], []byte{1, 's'}) {
		t.Fatalf("resume with a token % x", got)
	}
	h, err := decodeHeld(unhex(t, "2a00000000000000 02 dc050000 03 616263"))
	if err != nil || h != (heldFrame{token: 42, mode: HoldLease, ttlLeftMs: 1500, key: "abc"}) {
		t.Fatalf("got %+v %v", h, err)
	}
	for _, bad := range []string{
		"2a00000000000000 03 dc050000 01 61", // hold mode 3
		"2a00000000000000 01 dc050000 02 61", // key length
		"2a00000000000000 01 dc050000 00",    // empty key
	} {
		if _, err := decodeHeld(unhex(t, bad)); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
	r, err := decodeReply(unhex(t, "0d 0000000000000000 ffffffff"))
	if err != nil || r.status != StatusUnknownSession || !errors.Is(&StatusError{Op: "resume", Status: r.status}, ErrUnknownSession) {
		t.Fatalf("got %+v %v", r, err)
	}
}

// Lock modes (docs/protocol.md, "Lock modes"): the welcome's modes flag,
// status 15, and the accesses a caller may ask for.
func TestModesFlagStatusAndAccess(t *testing.T) {
	body := unhex(t, "00 01 10270000 0a000000 005c2605 0700000000000000 64000000 64000000 0100")
	for _, c := range []struct {
		extra            []byte
		resumable, modes bool
	}{{nil, false, false}, {[]byte{1}, true, false}, {[]byte{2}, false, true}, {[]byte{3}, true, true}} {
		w, err := decodeWelcome(append(append([]byte{}, body...), c.extra...))
		if err != nil {
			t.Fatal(err)
		}
		if (w.flags&flagResumable != 0) != c.resumable || (w.flags&flagModes != 0) != c.modes {
			t.Errorf("flags %v: resumable %v modes %v", c.extra, w.flags&flagResumable != 0, w.flags&flagModes != 0)
		}
	}
	r, err := decodeReply(unhex(t, "0f 0000000000000000 ffffffff"))
	if err != nil || r.status != StatusModeMismatch || r.status.String() != "mode_mismatch" || hasDetail(15) {
		t.Fatalf("mode_mismatch: got %+v %v", r, err)
	}
	var err2 error = &ModeMismatchError{Key: "pool", Slots: 3}
	var se *StatusError
	if !errors.Is(err2, ErrModeMismatch) || !errors.As(err2, &se) || se.Status != StatusModeMismatch || se.Key != "pool" ||
		!strings.Contains(err2.Error(), `"pool"`) || !strings.Contains(err2.Error(), "semaphore of 3") || errors.Is(err2, ErrInvalid) {
		t.Fatalf("ModeMismatchError: %v", err2)
	}
	if !errors.Is(&StatusError{Op: "acquire", Key: "k", Status: StatusModeMismatch}, ErrModeMismatch) {
		t.Fatal("a mode_mismatch StatusError does not match ErrModeMismatch")
	}
	mu := error(&ModesUnsupportedError{Addr: "127.0.0.1:1", Key: "doc", Access: Shared})
	if !errors.Is(mu, ErrModesUnsupported) || !strings.Contains(mu.Error(), "nothing was sent") || !strings.Contains(mu.Error(), "(shared)") {
		t.Fatalf("ModesUnsupportedError: %v", mu)
	}
	for _, a := range []Access{Exclusive, Shared, Semaphore(1), Semaphore(1<<32 - 1)} {
		if err := a.check(); err != nil {
			t.Errorf("%v: %v", a, err)
		}
	}
	for _, a := range []Access{Semaphore(0), {Kind: AccessShared, Slots: 2}, {Kind: AccessExclusive, Slots: 1}, {Kind: 3}} {
		if err := a.check(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: %v", a, err)
		}
	}
	if Exclusive.String() != "exclusive" || Shared.String() != "shared" || Semaphore(4).String() != "semaphore(4)" || (Access{}) != Exclusive {
		t.Fatal("access names")
	}
}

// A session source (an election's value) is up to 255 bytes, its size byte
// unsigned; a key stays 1..=127 (docs/protocol.md, "Sessions").
func TestASourceIsUpTo255BytesAndAKeyUpTo127(t *testing.T) {
	if MaxSourceLen != 255 || MaxValueLen != 255 || MaxKeyLen != 127 {
		t.Fatalf("bounds: source %d, value %d, key %d", MaxSourceLen, MaxValueLen, MaxKeyLen)
	}
	src := strings.Repeat("\xc3", 255)
	b := encodeProclaim(9, 7, "lead", src)
	if at := headerLen + 8 + 1 + 4; b[at] != 255 || string(b[at+1:]) != src {
		t.Fatalf("proclaim source size %d, %d bytes after it", b[at], len(b[at+1:]))
	}
	ev, err := decodeEvent(eventBody(EventProclaimed, "lead", Holder{Token: 7, Hold: HoldSession, Source: src}))
	if err != nil || ev.Source != src || ev.Key != "lead" {
		t.Fatalf("event: %+v %v", ev, err)
	}
	if err := checkValue(src); err != nil {
		t.Fatalf("a 255-byte value refused: %v", err)
	}
	if err := checkValue(src + "x"); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "1..255 bytes, got 256") {
		t.Fatalf("a 256-byte value: %v", err)
	}
}
