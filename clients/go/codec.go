package ringlock

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The session protocol's frames (docs/protocol.md, "Sessions"). Every frame,
// in both directions, is a 7-byte header followed by at most 512 body bytes:
//
//	request  [u8 op][u32 rid][u16 bodyLen][body]     op 7..=13, 15..=17
//	answer   [u8 kind][u32 rid][u16 bodyLen][body]   kind 0x80 Reply, 0x81 Lost, 0x82 Held, 0x83 Event
//
// Integers are little-endian. This file holds the encoders and decoders
// only, so that they can be tested without a server.

const (
	protocolVersion = 1
	headerLen       = 7
	bodyMax         = 512

	opHello    = 7
	opAcquire  = 8
	opRelease  = 9
	opExtend   = 10
	opCancel   = 11
	opPing     = 12
	opResume   = 13 // instead of a Hello: takes a replicated session over
	opWatch    = 15 // watch a key's holders (flagWatches)
	opUnwatch  = 16 // end a watch: the Watch's rid and key
	opProclaim = 17 // a hold's new source, same token (flagProclaim)

	kindReply = 0x80
	kindLost  = 0x81
	kindHeld  = 0x82 // one hold of a resumed session, before the Resume's welcome
	kindEvent = 0x83 // one holder, or one change of the holders, of a watched key (rid = the Watch's)

	// flagResumable is bit 0 of the welcome's flags byte (after the
	// 32-byte body): the session is replicated and can be resumed.
	flagResumable = 1
	// flagModes is bit 1: the server takes an Acquire's access trailer
	// (shared and semaphore holds) and may answer mode_mismatch. The
	// trailer is sent only to a server that set it.
	flagModes = 2
	// flagWatches is bit 2: the server takes Watch and Unwatch and pushes
	// Events. Neither is sent to a server that did not set it (an older
	// one closes the connection on an op it does not know).
	flagWatches = 4
	// flagProclaim is bit 3: the server takes Proclaim (an election
	// leader's new value) and sends proclaimed Events. Proclaim is not
	// sent to a server that did not set it.
	flagProclaim = 8

	// replyBodyLen is the body of every Reply but the Hello's.
	replyBodyLen = 13
	// welcomeBodyLen is the Hello reply's body in protocol version 1; a
	// later server may append fields, which are skipped.
	welcomeBodyLen = 32

	// waitForever is the wait_ms of an Acquire without a server deadline.
	waitForever = 0xFFFFFFFF
	// noTTL is the ttl_left_ms of an answer without a TTL.
	noTTL = 0xFFFFFFFF

	// MaxKeyLen is the longest key in bytes (a key is 1..=127 bytes).
	MaxKeyLen = 127
	// MaxSourceLen is the longest source name in bytes: an Acquire's and
	// a Proclaim's size byte of it is unsigned (the Locking-Center lock
	// port's is signed: 127 there). A ringlockd older than 255-byte
	// sources answers a longer one than 127 "invalid".
	MaxSourceLen = 255
	// MaxAuthTokenLen is the longest auth token in bytes.
	MaxAuthTokenLen = 255
)

// HoldMode is how a granted lock is held: the Acquire's hold byte.
type HoldMode uint8

const (
	// HoldPersistent: Locking-Center semantics, held until released by
	// token or reset, whatever happens to the session.
	HoldPersistent HoldMode = 0
	// HoldSession (the default): freed by the server the moment the
	// session ends (its connection closes or fails, or its keep-alive
	// deadline passes).
	HoldSession HoldMode = 1
	// HoldLease: freed by the server when its TTL passes without an
	// Extend; it survives the session that took it.
	HoldLease HoldMode = 2
)

func (m HoldMode) String() string {
	switch m {
	case HoldPersistent:
		return "persistent"
	case HoldSession:
		return "session"
	case HoldLease:
		return "lease"
	}
	return fmt.Sprintf("hold(%d)", uint8(m))
}

// frame starts a request frame with op and rid; finish fills in the body
// length.
func frame(op byte, rid uint32, bodyCap int) []byte {
	b := make([]byte, headerLen, headerLen+bodyCap)
	b[0] = op
	binary.LittleEndian.PutUint32(b[1:5], rid)
	return b
}

func finish(b []byte) []byte {
	binary.LittleEndian.PutUint16(b[5:7], uint16(len(b)-headerLen))
	return b
}

func putName(b []byte, name string) []byte {
	b = append(b, byte(len(name)))
	return append(b, name...)
}

func putU32(b []byte, v uint32) []byte {
	var x [4]byte
	binary.LittleEndian.PutUint32(x[:], v)
	return append(b, x[:]...)
}

func putU64(b []byte, v uint64) []byte {
	var x [8]byte
	binary.LittleEndian.PutUint64(x[:], v)
	return append(b, x[:]...)
}

// encodeHello: [u8 version][u32 keepalive_ms], then [u8 authLen][auth] if
// there is a token (authLen 0 is the same as none, so none is sent).
func encodeHello(rid uint32, version uint8, keepaliveMs uint32, auth []byte) []byte {
	b := frame(opHello, rid, 6+len(auth))
	b = append(b, version)
	b = putU32(b, keepaliveMs)
	if len(auth) > 0 {
		b = append(b, byte(len(auth)))
		b = append(b, auth...)
	}
	return finish(b)
}

// encodeResume: [u8 version][u64 session_id], then [u8 authLen][auth] if
// there is a token.
func encodeResume(rid uint32, version uint8, sessionID uint64, auth []byte) []byte {
	b := frame(opResume, rid, 10+len(auth))
	b = append(b, version)
	b = putU64(b, sessionID)
	if len(auth) > 0 {
		b = append(b, byte(len(auth)))
		b = append(b, auth...)
	}
	return finish(b)
}

// encodeAcquire: [u8 hold][u32 ttl_ms][u32 wait_ms][u8 keyLen][key][u8 srcLen][src],
// then [u8 access][u32 slots] for a shared or semaphore request only: an
// exclusive one ends at the source, as an older server expects. access
// is valid (Access.check).
func encodeAcquire(rid uint32, hold HoldMode, ttlMs, waitMs uint32, key, source string, access Access) []byte {
	b := frame(opAcquire, rid, 16+len(key)+len(source))
	b = append(b, byte(hold))
	b = putU32(b, ttlMs)
	b = putU32(b, waitMs)
	b = putName(b, key)
	b = putName(b, source)
	if access.Kind != AccessExclusive {
		b = append(b, byte(access.Kind))
		b = putU32(b, access.Slots)
	}
	return finish(b)
}

// encodeRelease: [u64 token][u8 keyLen][key].
func encodeRelease(rid uint32, token uint64, key string) []byte {
	b := frame(opRelease, rid, 9+len(key))
	b = putU64(b, token)
	b = putName(b, key)
	return finish(b)
}

// encodeExtend: [u64 token][u32 ttl_ms][u8 keyLen][key].
func encodeExtend(rid uint32, token uint64, ttlMs uint32, key string) []byte {
	b := frame(opExtend, rid, 13+len(key))
	b = putU64(b, token)
	b = putU32(b, ttlMs)
	b = putName(b, key)
	return finish(b)
}

// encodeCancel: [u32 rid of the Acquire][u8 keyLen][key of the Acquire].
func encodeCancel(rid uint32, target uint32, key string) []byte {
	b := frame(opCancel, rid, 5+len(key))
	b = putU32(b, target)
	b = putName(b, key)
	return finish(b)
}

// encodeWatch: [u8 keyLen][key].
func encodeWatch(rid uint32, key string) []byte {
	b := frame(opWatch, rid, 1+len(key))
	b = putName(b, key)
	return finish(b)
}

// encodeUnwatch: [u32 rid of the Watch][u8 keyLen][key of the Watch].
func encodeUnwatch(rid uint32, target uint32, key string) []byte {
	b := frame(opUnwatch, rid, 5+len(key))
	b = putU32(b, target)
	b = putName(b, key)
	return finish(b)
}

// encodeProclaim: [u64 token][u8 keyLen][key][u8 srcLen][src].
func encodeProclaim(rid uint32, token uint64, key, source string) []byte {
	b := frame(opProclaim, rid, 10+len(key)+len(source))
	b = putU64(b, token)
	b = putName(b, key)
	b = putName(b, source)
	return finish(b)
}

// encodePing: an empty body.
func encodePing(rid uint32) []byte {
	return finish(frame(opPing, rid, 0))
}

// welcome is the Hello reply.
type welcome struct {
	status      Status
	version     uint8
	keepaliveMs uint32
	minTTLMs    uint32
	maxTTLMs    uint32
	sessionID   uint64
	maxKeys     uint32
	maxWaiters  uint32
	shards      uint16
	flags       uint8 // the byte after the 32-byte body; 0 when absent
}

// heldFrame is a Held frame (answers a Resume, before its welcome):
// [u64 token][u8 hold][u32 ttl_left_ms][u8 keyLen][key].
type heldFrame struct {
	token     uint64
	mode      HoldMode
	ttlLeftMs uint32 // noTTL for a hold that is not a lease
	key       string
}

// reply is every other Reply: [u8 status][u64 token][u32 ttl_left_ms], or
// for a status with detail (hasDetail) [u8 status][u8 len][detail].
type reply struct {
	status    Status
	token     uint64
	ttlLeftMs uint32 // noTTL where it does not apply
	detail    []byte // the detail of a status with detail, else nil
}

// lostPush is a Lost push (rid 0): [u64 token][u8 reason][u8 keyLen][key].
type lostPush struct {
	token  uint64
	reason uint8
	key    string
}

var errShortBody = errors.New("malformed answer body")

// header splits an answer header. blen is checked against bodyMax.
func decodeHeader(h []byte) (kind byte, rid uint32, blen int, err error) {
	kind = h[0]
	rid = binary.LittleEndian.Uint32(h[1:5])
	blen = int(binary.LittleEndian.Uint16(h[5:7]))
	if blen > bodyMax {
		return 0, 0, 0, fmt.Errorf("answer body of %d bytes (at most %d)", blen, bodyMax)
	}
	if kind != kindReply && kind != kindLost && kind != kindHeld && kind != kindEvent {
		return 0, 0, 0, fmt.Errorf("unknown answer kind %#02x", kind)
	}
	return kind, rid, blen, nil
}

func decodeStatus(b byte) (Status, error) {
	if b > byte(StatusModeMismatch) {
		return 0, fmt.Errorf("unknown status %d", b)
	}
	return Status(b), nil
}

// decodeWelcome reads a Hello reply body of at least 32 bytes (fields a
// later version appends are ignored).
func decodeWelcome(b []byte) (welcome, error) {
	if len(b) < welcomeBodyLen {
		return welcome{}, errShortBody
	}
	st, err := decodeStatus(b[0])
	if err != nil {
		return welcome{}, err
	}
	le := binary.LittleEndian
	var flags uint8
	if len(b) > welcomeBodyLen {
		flags = b[welcomeBodyLen]
	}
	return welcome{
		flags:       flags,
		status:      st,
		version:     b[1],
		keepaliveMs: le.Uint32(b[2:6]),
		minTTLMs:    le.Uint32(b[6:10]),
		maxTTLMs:    le.Uint32(b[10:14]),
		sessionID:   le.Uint64(b[14:22]),
		maxKeys:     le.Uint32(b[22:26]),
		maxWaiters:  le.Uint32(b[26:30]),
		shards:      le.Uint16(b[30:32]),
	}, nil
}

// hasDetail reports whether a Reply whose first body byte is b has the
// layout [u8 status][u8 len][detail] (unsupported_version, not_leader),
// whatever the request it answers.
func hasDetail(b byte) bool {
	return Status(b) == StatusUnsupportedVersion || Status(b) == StatusNotLeader
}

// decodeReply reads a Reply body other than the welcome: its first byte
// picks the layout, 13 bytes or a status with detail.
func decodeReply(b []byte) (reply, error) {
	if len(b) > 0 && hasDetail(b[0]) {
		if len(b) < 2 || len(b) != 2+int(b[1]) {
			return reply{}, fmt.Errorf("a %s reply of %d body bytes (its layout is [status][len][detail])", Status(b[0]), len(b))
		}
		return reply{status: Status(b[0]), token: 0, ttlLeftMs: noTTL, detail: append([]byte{}, b[2:]...)}, nil
	}
	if len(b) != replyBodyLen {
		return reply{}, fmt.Errorf("reply body of %d bytes (want %d)", len(b), replyBodyLen)
	}
	st, err := decodeStatus(b[0])
	if err != nil {
		return reply{}, err
	}
	return reply{
		status:    st,
		token:     binary.LittleEndian.Uint64(b[1:9]),
		ttlLeftMs: binary.LittleEndian.Uint32(b[9:13]),
	}, nil
}

// decodeLost reads a Lost push body.
func decodeLost(b []byte) (lostPush, error) {
	if len(b) < 10 {
		return lostPush{}, errShortBody
	}
	n := int(b[9])
	if n < 1 || n > MaxKeyLen || len(b) != 10+n {
		return lostPush{}, fmt.Errorf("lost push with a key of %d bytes in a body of %d", n, len(b))
	}
	if b[8] != LostExpired && b[8] != LostReset {
		return lostPush{}, fmt.Errorf("lost push with unknown reason %d", b[8])
	}
	return lostPush{
		token:  binary.LittleEndian.Uint64(b[0:8]),
		reason: b[8],
		key:    string(b[10:]),
	}, nil
}

// decodeHeld reads a Held frame's body.
func decodeHeld(b []byte) (heldFrame, error) {
	if len(b) < 15 {
		return heldFrame{}, errShortBody
	}
	n := int(b[13])
	if n < 1 || n > MaxKeyLen || len(b) != 14+n {
		return heldFrame{}, fmt.Errorf("held frame with a key of %d bytes in a body of %d", n, len(b))
	}
	if b[8] > byte(HoldLease) {
		return heldFrame{}, fmt.Errorf("held frame with unknown hold mode %d", b[8])
	}
	return heldFrame{
		token:     binary.LittleEndian.Uint64(b[0:8]),
		mode:      HoldMode(b[8]),
		ttlLeftMs: binary.LittleEndian.Uint32(b[9:13]),
		key:       string(b[14:]),
	}, nil
}

// eventBodyMin is an Event body with a 1-byte key and an empty source.
const eventBodyMin = 18

// errUnknownEvent is decodeEvent's answer to an Event whose kind byte this
// client does not know (a later server's): the frame is skipped, not a
// broken stream (docs/protocol.md, "Elections").
var errUnknownEvent = errors.New("event of a kind this client does not know")

// decodeEvent reads an Event body: [u8 event][u64 token][u8 hold][u8
// access][u32 slots][u8 keyLen][key][u8 srcLen][src]. An event kind this
// client does not know is errUnknownEvent, whatever follows it (its
// layout may be another): the caller skips the frame. Bytes after the
// source (fields a later version appends) are skipped; anything else that
// does not fit (a cut, an unknown hold or access, slots on an exclusive
// or shared holder, a semaphore of 0, a key of 0 or over 127 bytes, a
// source over 255) is an error.
func decodeEvent(b []byte) (WatchEvent, error) {
	if len(b) > 0 && EventKind(b[0]) > EventProclaimed {
		return WatchEvent{}, fmt.Errorf("%w: %d", errUnknownEvent, b[0])
	}
	if len(b) < eventBodyMin {
		return WatchEvent{}, errShortBody
	}
	kind := EventKind(b[0])
	if b[9] > byte(HoldLease) {
		return WatchEvent{}, fmt.Errorf("event with unknown hold mode %d", b[9])
	}
	access := Access{Kind: AccessKind(b[10]), Slots: binary.LittleEndian.Uint32(b[11:15])}
	if err := access.check(); err != nil {
		return WatchEvent{}, fmt.Errorf("event with access %d and %d slots", b[10], access.Slots)
	}
	at := 15
	name := func(min, max int) (string, error) {
		if at >= len(b) {
			return "", errShortBody
		}
		n := int(b[at])
		if n < min || n > max || at+1+n > len(b) {
			return "", fmt.Errorf("event with a name of %d bytes at %d in a body of %d", n, at, len(b))
		}
		s := string(b[at+1 : at+1+n])
		at += 1 + n
		return s, nil
	}
	key, err := name(1, MaxKeyLen)
	if err != nil {
		return WatchEvent{}, err
	}
	src, err := name(0, MaxSourceLen)
	if err != nil {
		return WatchEvent{}, err
	}
	return WatchEvent{
		Kind: kind,
		Key:  key,
		Holder: Holder{
			Token:  binary.LittleEndian.Uint64(b[1:9]),
			Hold:   HoldMode(b[9]),
			Access: access,
			Source: src,
		},
	}, nil
}
