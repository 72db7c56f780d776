// etcd-native-loadgen: etcd's own lock recipe, driven the way
// ringlock-loadgen drives everything else, for the etcd-native rows of
// scripts/bench.sh and scripts/cluster-bench.sh.
//
// The clients (worker goroutines) share one clientv3 client (one gRPC
// connection, HTTP/2 streams side by side), as an application does: a
// clientv3.Client is safe for concurrent use and meant to be shared, and
// one connection gave more cycles/s than one per client in an A/B on the
// development machine (--grpc-conns 0: one per client, like
// ringlock-loadgen's one TCP connection per client). Each client has its
// own concurrency.Session (one lease, kept alive by the session); a cycle is
// concurrency.NewMutex(session, KEY).Lock then Unlock. That is what etcd's
// v3 lock service (the gateway's /v3/lock/lock) runs inside the server, here
// in the client over native gRPC: Lock is one Txn (put our key under KEY/ if
// absent + read the prefix's first creator) when KEY is free, and waits for
// the deletes of the keys created before ours when it is not; Unlock is one
// Delete. Both are raft writes (fsynced).
//
// The command line is the subset of ringlock-loadgen's that this needs
// (same names, same units, same defaults), and --json prints the same JSON
// line, field for field, so the scripts read both alike. See
// docs/bench.md ("etcd through its native client").
//
// Built by the scripts with Debian's Go in GOPATH mode from Debian's etcd
// 3.4 sources (golang-etcd-server-dev, under /usr/share/gocode): no module
// proxy, no network.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	noHolder = math.MaxUint32
	// Pause after a failed cycle before the next one (closed loop), as
	// ringlock-loadgen does, so a dead server is not a busy loop.
	errorPause = time.Millisecond
)

func monoNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// sleepUntil waits for the monotonic instant at (ns).
func sleepUntil(at int64) {
	if d := at - monoNs(); d > 0 {
		time.Sleep(time.Duration(d))
	}
}

// parseDuration: ringlock-loadgen's units (ns, us, ms, s, m; bare = s).
func parseDuration(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return !(r >= '0' && r <= '9' || r == '.') })
	if i < 0 {
		i = len(s)
	}
	v, err := strconv.ParseFloat(s[:i], 64)
	if err != nil || v < 0 || math.IsInf(v, 0) {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	scale := map[string]float64{"": 1e9, "s": 1e9, "ms": 1e6, "us": 1e3, "µs": 1e3, "ns": 1, "m": 60e9, "min": 60e9}[s[i:]]
	if scale == 0 {
		return 0, fmt.Errorf("bad duration unit in %q (use ns, us, ms, s, m)", s)
	}
	return int64(math.Round(v * scale)), nil
}

type durFlag struct{ ns *int64 }

func (d durFlag) String() string {
	if d.ns == nil {
		return ""
	}
	return fmt.Sprintf("%dns", *d.ns)
}
func (d durFlag) Set(s string) error {
	v, err := parseDuration(s)
	if err == nil {
		*d.ns = v
	}
	return err
}

// rng: ringlock-loadgen's xorshift64* seeded through splitmix64, so the
// uniform key sequences are the same as its.
type rng uint64

func newRng(seed uint64) rng {
	z := seed + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	if z == 0 {
		z = 1
	}
	return rng(z)
}
func (r *rng) next() uint64 {
	x := uint64(*r)
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	*r = rng(x)
	return x * 0x2545F4914F6CDD1D
}
func (r *rng) below(n uint64) uint64 {
	hi, _ := mul64(r.next(), n)
	return hi
}
func mul64(a, b uint64) (uint64, uint64) {
	const mask32 = 1<<32 - 1
	a0, a1 := a&mask32, a>>32
	b0, b1 := b&mask32, b>>32
	w0 := a0 * b0
	t := a1*b0 + w0>>32
	w1 := t & mask32
	w2 := t >> 32
	w1 += a0 * b1
	return a1*b1 + w2 + w1>>32, a * b
}

type config struct {
	endpoints   []string
	connections int
	rate        float64
	durationNs  int64
	warmupNs    int64
	drainNs     int64
	keys        int
	dist        string
	holdNs      int64
	connMode    string
	lockTTLMs   int64
	keyPrefix   string
	seed        uint64
	label       string
	json        bool
	hgrm        string
	noProgress  bool
	grpcConns   int
}

// keyState: what this run's clients know about one key (contention
// figures only, never a lock), as in ringlock-loadgen.
type keyState struct {
	holder      uint32
	waiters     int32
	lastRelease int64
}

type errCounts struct{ server, connect, tls, io, protocol, notHeld, incomplete uint64 }

func (e *errCounts) total() uint64 {
	return e.server + e.connect + e.tls + e.io + e.protocol + e.notHeld + e.incomplete
}

type stats struct {
	lock, lockUncorrected, unlock, cycle, queueWait, handoff, handshake []int64
	cycles, cyclesAll, grants                                           uint64
	connects                                                            uint64
	errs                                                                errCounts
	firstErr                                                            string
	firstErrNs                                                          int64
	grantsPerClient                                                     []uint64
	lastDone                                                            int64
}

func (s *stats) noteErr(msg string) {
	now := monoNs()
	if s.firstErr == "" || now < s.firstErrNs {
		s.firstErr, s.firstErrNs = msg, now
	}
}

type worker struct {
	id   int
	cfg  *config
	sess *concurrency.Session
	keys []keyState
	st   stats
	rng  rng
}

func (w *worker) run(start, warmEnd, end, deadline int64, period int64) {
	cfg := w.cfg
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Duration(deadline-monoNs())))
	defer cancel()
	next := start
	if period > 0 {
		next = start + period*int64(w.id)/int64(cfg.connections)
	}
	st := &w.st
	for {
		if next >= end {
			break
		}
		sleepUntil(next)
		intended := next
		measured := intended >= warmEnd
		var key int
		switch cfg.dist {
		case "private":
			key = w.id % cfg.keys
		case "hot":
			key = 0
		default:
			key = int(w.rng.below(uint64(cfg.keys)))
		}
		k := &w.keys[key]
		name := cfg.keyPrefix + ":" + strconv.Itoa(key)
		m := concurrency.NewMutex(w.sess, name)
		firstSend := monoNs()
		contended := atomic.AddInt32(&k.waiters, 1) > 1 || atomic.LoadUint32(&k.holder) != noHolder
		err := m.Lock(ctx)
		now := monoNs()
		atomic.AddInt32(&k.waiters, -1)
		failed := false
		if err != nil {
			failed = true
			if measured {
				w.countErr(err, now, deadline)
				if isDeadline(err) {
					// Not granted: its lock latency is at least this long.
					st.lock = append(st.lock, now-intended)
					st.lockUncorrected = append(st.lockUncorrected, now-firstSend)
				}
			}
			st.noteErr(fmt.Sprintf("Lock: %v", err))
		} else {
			atomic.StoreUint32(&k.holder, uint32(w.id))
			if measured {
				st.grants++
				st.grantsPerClient[w.id]++
				st.lock = append(st.lock, now-intended)
				st.lockUncorrected = append(st.lockUncorrected, now-firstSend)
				if contended {
					st.queueWait = append(st.queueWait, now-firstSend)
					if rel := atomic.LoadInt64(&k.lastRelease); rel > firstSend {
						st.handoff = append(st.handoff, now-rel)
					}
				}
			}
			unlockDue := now + cfg.holdNs
			if cfg.holdNs > 0 {
				sleepUntil(unlockDue)
			}
			rel := monoNs()
			atomic.CompareAndSwapUint32(&k.holder, uint32(w.id), noHolder)
			atomic.StoreInt64(&k.lastRelease, rel)
			err = m.Unlock(ctx)
			now = monoNs()
			if err != nil {
				failed = true
				if measured {
					w.countErr(err, now, deadline)
				}
				st.noteErr(fmt.Sprintf("Unlock: %v", err))
			} else {
				st.cyclesAll++
				if measured {
					st.cycles++
					st.unlock = append(st.unlock, now-unlockDue)
					st.cycle = append(st.cycle, now-intended)
				}
			}
		}
		st.lastDone = now
		if now >= deadline {
			break
		}
		if period > 0 {
			next = intended + period
		} else {
			next = now
		}
		if failed && next < now+int64(errorPause) {
			next = now + int64(errorPause)
		}
	}
}

func isDeadline(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
}

func (w *worker) countErr(err error, now, deadline int64) {
	e := &w.st.errs
	switch {
	case isDeadline(err) && now >= deadline-int64(time.Millisecond):
		// Still open when the drain time ran out.
		e.incomplete++
	case status.Code(err) == codes.Unavailable || status.Code(err) == codes.Canceled:
		e.io++
	default:
		e.server++
	}
}

func pct(sorted []int64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p >= 100 {
		return float64(sorted[n-1]) / 1e3
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	if rank < 1 {
		rank = 1
	}
	return float64(sorted[rank-1]) / 1e3
}

var percentiles = []struct {
	label string
	p     float64
}{{"p50", 50}, {"p90", 90}, {"p99", 99}, {"p999", 99.9}, {"p9999", 99.99}, {"max", 100}}

var curve = []float64{0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999, 100}

func sortNs(v []int64) []int64 {
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	return v
}

func jsonHist(b *strings.Builder, name string, v []int64) {
	fmt.Fprintf(b, "%q:{\"count\":%d", name, len(v))
	for _, p := range percentiles {
		fmt.Fprintf(b, ",%q:%.3f", p.label, pct(v, p.p))
	}
	mean := 0.0
	if len(v) > 0 {
		var sum float64
		for _, x := range v {
			sum += float64(x)
		}
		mean = sum / float64(len(v)) / 1e3
	}
	fmt.Fprintf(b, ",\"mean\":%.3f}", mean)
}

// jsonStr: a JSON string (Go's %q is close but escapes differently).
func jsonStr(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString("\\\"")
		case r == '\\':
			b.WriteString("\\\\")
		case r < 0x20:
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// hgrm: HdrHistogram's percentile-distribution text of the lock latency
// (µs), from the exact samples, as ringlock-loadgen's --hgrm writes it.
func hgrm(v []int64) string {
	var b strings.Builder
	b.WriteString("       Value     Percentile TotalCount 1/(1-Percentile)\n\n")
	n := len(v)
	if n == 0 {
		return b.String()
	}
	q := 0.0
	for {
		rank := int(math.Ceil(q * float64(n)))
		if rank < 1 {
			rank = 1
		}
		inv := "inf"
		if q < 1 {
			inv = fmt.Sprintf("%.2f", 1/(1-q))
		}
		fmt.Fprintf(&b, "%12.3f %14.12f %10d %14s\n", float64(v[rank-1])/1e3, q, rank, inv)
		if q >= 1 || rank >= n {
			if q < 1 {
				fmt.Fprintf(&b, "%12.3f %14.12f %10d %14s\n", float64(v[n-1])/1e3, 1.0, n, "inf")
			}
			break
		}
		half := math.Pow(2, math.Floor(math.Log2(1/(1-q)))+1)
		q += 1 / (half * 5)
		if q > 1 {
			q = 1
		}
	}
	var sum, sq float64
	for _, x := range v {
		sum += float64(x)
	}
	mean := sum / float64(n)
	for _, x := range v {
		sq += (float64(x) - mean) * (float64(x) - mean)
	}
	fmt.Fprintf(&b, "#[Mean    = %12.3f, StdDeviation   = %12.3f]\n#[Max     = %12.3f, Total count    = %12d]\n",
		mean/1e3, math.Sqrt(sq/float64(n))/1e3, float64(v[n-1])/1e3, n)
	return b.String()
}

func main() {
	cfg := config{}
	var target string
	fs := flag.NewFlagSet("etcd-native-loadgen", flag.ContinueOnError)
	fs.StringVar(&target, "target", "", "etcd://HOST:PORT[,HOST:PORT...] (the endpoints given to clientv3; the scripts give the leader's only)")
	fs.IntVar(&cfg.connections, "connections", 1, "clients: one goroutine and one session (lease) each")
	fs.Float64Var(&cfg.rate, "rate", 0, "total cycles/s over all clients, each gets R/N; 0 = closed loop")
	cfg.durationNs, cfg.warmupNs, cfg.drainNs = 10e9, 1e9, 5e9
	fs.Var(durFlag{&cfg.durationNs}, "duration", "measured time (ns/us/ms/s/m)")
	fs.Var(durFlag{&cfg.warmupNs}, "warmup", "unmeasured lead-in")
	fs.Var(durFlag{&cfg.drainNs}, "drain", "wait for in-flight cycles after the end")
	fs.IntVar(&cfg.keys, "keys", 1000, "key space size")
	fs.StringVar(&cfg.dist, "dist", "uniform", "uniform | hot | private (key = client id)")
	fs.Var(durFlag{&cfg.holdNs}, "hold", "time inside the critical section")
	fs.StringVar(&cfg.connMode, "conn-mode", "persistent", "persistent only (a gRPC client keeps its connection)")
	fs.Int64Var(&cfg.lockTTLMs, "lock-ttl-ms", 30000, "session (lease) TTL, ms (at least 5 s, as ringlock-loadgen's etcd:// target)")
	fs.StringVar(&cfg.keyPrefix, "key-prefix", "lg", "key prefix")
	fs.Uint64Var(&cfg.seed, "seed", 1, "RNG seed")
	fs.StringVar(&cfg.label, "label", "", "free text echoed in the report")
	fs.BoolVar(&cfg.json, "json", false, "last stdout line: one JSON object, ringlock-loadgen's fields")
	fs.StringVar(&cfg.hgrm, "hgrm", "", "write the lock-latency percentile distribution as .hgrm")
	fs.BoolVar(&cfg.noProgress, "no-progress", false, "no per-second progress line on stderr")
	fs.IntVar(&cfg.grpcConns, "grpc-conns", 1, "clientv3 clients (gRPC connections) the clients share, client i on i mod N; 0 = one per client")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	usage := func(msg string) {
		fmt.Fprintf(os.Stderr, "error: %s\n", msg)
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		usage(fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	rest := strings.TrimPrefix(target, "etcd://")
	if !strings.HasPrefix(target, "etcd://") || rest == "" {
		usage("--target etcd://HOST:PORT[,HOST:PORT...] is required")
	}
	cfg.endpoints = strings.Split(rest, ",")
	if cfg.connections < 1 || cfg.keys < 1 {
		usage("--connections and --keys must be at least 1")
	}
	if cfg.rate < 0 {
		usage("--rate must be >= 0")
	}
	switch cfg.dist {
	case "uniform", "hot", "private":
	default:
		usage(fmt.Sprintf("--dist %q is not supported here (uniform | hot | private)", cfg.dist))
	}
	if cfg.connMode != "persistent" {
		usage("--conn-mode: only persistent (a gRPC client is a long-lived connection)")
	}
	ttl := int(cfg.lockTTLMs / 1000)
	if ttl < 5 {
		ttl = 5
	}

	// Set-up, before the clock starts: every client dialled and its session
	// (lease grant + keep-alive stream) open. Timed as handshake_us.
	keys := make([]keyState, cfg.keys)
	for i := range keys {
		keys[i].holder = noHolder
	}
	workers := make([]*worker, cfg.connections)
	seed := newRng(cfg.seed)
	handshake := make([]int64, 0, cfg.connections)
	var clients []*clientv3.Client
	if cfg.grpcConns <= 0 || cfg.grpcConns > cfg.connections {
		cfg.grpcConns = cfg.connections
	}
	for i := range workers {
		t0 := monoNs()
		if i < cfg.grpcConns {
			// The client logs errors only: its retry warnings (one line per
			// failed RPC) would cost CPU on the client's CPU.
			logCfg := zap.NewProductionConfig()
			logCfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
			cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.endpoints, DialTimeout: 5 * time.Second, LogConfig: &logCfg})
			if err != nil {
				fmt.Fprintf(os.Stderr, "error: client %d: dial %v: %v\n", i, cfg.endpoints, err)
				os.Exit(1)
			}
			clients = append(clients, cli)
		}
		cli := clients[i%cfg.grpcConns]
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: client %d: session (lease grant): %v\n", i, err)
			os.Exit(1)
		}
		handshake = append(handshake, monoNs()-t0)
		workers[i] = &worker{id: i, cfg: &cfg, sess: sess, keys: keys, rng: newRng(seed.next())}
		workers[i].st.grantsPerClient = make([]uint64, cfg.connections)
	}

	period := int64(0)
	if cfg.rate > 0 {
		period = int64(math.Max(1, math.Round(1e9/(cfg.rate/float64(cfg.connections)))))
	}
	start := monoNs() + 1_000_000
	warmEnd := start + cfg.warmupNs
	end := warmEnd + cfg.durationNs
	deadline := end + cfg.drainNs
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func(w *worker) { defer wg.Done(); w.run(start, warmEnd, end, deadline, period) }(w)
	}
	stop := make(chan struct{})
	if !cfg.noProgress {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for s := 1; ; s++ {
				select {
				case <-stop:
					return
				case <-t.C:
					fmt.Fprintf(os.Stderr, "[%ds] running\n", s)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	endedNs := monoNs()

	// Merge.
	var st stats
	st.grantsPerClient = make([]uint64, cfg.connections)
	st.handshake = handshake
	st.connects = uint64(len(clients))
	for _, w := range workers {
		s := &w.st
		st.lock = append(st.lock, s.lock...)
		st.lockUncorrected = append(st.lockUncorrected, s.lockUncorrected...)
		st.unlock = append(st.unlock, s.unlock...)
		st.cycle = append(st.cycle, s.cycle...)
		st.queueWait = append(st.queueWait, s.queueWait...)
		st.handoff = append(st.handoff, s.handoff...)
		st.cycles += s.cycles
		st.cyclesAll += s.cyclesAll
		st.grants += s.grants
		e, f := &st.errs, &s.errs
		e.server += f.server
		e.connect += f.connect
		e.io += f.io
		e.incomplete += f.incomplete
		if s.firstErr != "" && (st.firstErr == "" || s.firstErrNs < st.firstErrNs) {
			st.firstErr, st.firstErrNs = s.firstErr, s.firstErrNs
		}
		for i, g := range s.grantsPerClient {
			st.grantsPerClient[i] += g
		}
		if s.lastDone > st.lastDone {
			st.lastDone = s.lastDone
		}
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpuUser := float64(ru.Utime.Sec) + float64(ru.Utime.Usec)/1e6
	cpuSys := float64(ru.Stime.Sec) + float64(ru.Stime.Usec)/1e6
	for _, c := range clients {
		c.Close()
	}
	drain := int64(0)
	if st.lastDone > end {
		drain = st.lastDone - end
	}
	for _, v := range [][]int64{st.lock, st.lockUncorrected, st.unlock, st.cycle, st.queueWait, st.handoff, st.handshake} {
		sortNs(v)
	}
	opsPerSec := 0.0
	if cfg.durationNs+drain > 0 {
		opsPerSec = float64(st.cycles) / (float64(cfg.durationNs+drain) / 1e9)
	}
	gmin, gmax, sum, sq := uint64(math.MaxUint64), uint64(0), 0.0, 0.0
	for _, g := range st.grantsPerClient {
		if g < gmin {
			gmin = g
		}
		if g > gmax {
			gmax = g
		}
		sum += float64(g)
		sq += float64(g) * float64(g)
	}
	jain := 0.0
	if sq > 0 {
		jain = sum * sum / (float64(len(st.grantsPerClient)) * sq)
	}
	if cfg.hgrm != "" {
		if err := os.WriteFile(cfg.hgrm, []byte(hgrm(st.lock)), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "error: writing %s: %v\n", cfg.hgrm, err)
			os.Exit(1)
		}
	}

	// Text summary (stdout), then the JSON line.
	mode := "closed-loop"
	if cfg.rate > 0 {
		mode = fmt.Sprintf("open-loop rate=%g/s", cfg.rate)
	}
	fmt.Printf("target etcd://%s (native gRPC, clientv3 concurrency.Mutex)  %s  connections=%d persistent mix=lock-unlock keys=%d dist=%s hold=%gus\n",
		strings.Join(cfg.endpoints, ","), mode, cfg.connections, cfg.keys, cfg.dist, float64(cfg.holdNs)/1e3)
	fmt.Printf("cycles %d in %.2fs = %.1f/s   grants %d  connects %d\n", st.cycles, float64(cfg.durationNs)/1e9, opsPerSec, st.grants, st.connects)
	fmt.Printf("%-24s%10s%10s%10s%10s%10s%10s%10s\n", "latency (us)", "count", "p50", "p90", "p99", "p99.9", "p99.99", "max")
	for _, h := range []struct {
		name string
		v    []int64
	}{{"lock", st.lock}, {"unlock", st.unlock}, {"cycle", st.cycle}, {"queue wait (contended)", st.queueWait}, {"hand-off", st.handoff}, {"dial + session", st.handshake}} {
		fmt.Printf("%-24s%10d", h.name, len(h.v))
		for _, p := range percentiles {
			fmt.Printf("%10.1f", pct(h.v, p.p))
		}
		fmt.Println()
	}
	fmt.Printf("errors %d (server %d, io %d, incomplete %d)\n", st.errs.total(), st.errs.server, st.errs.io, st.errs.incomplete)
	if st.firstErr != "" {
		fmt.Printf("first error: %s\n", st.firstErr)
	}
	if cfg.json {
		var b strings.Builder
		rateMode := "closed"
		if cfg.rate > 0 {
			rateMode = "open"
		}
		fmt.Fprintf(&b, "{\"target\":%s,\"label\":%s,\"connections\":%d,\"threads\":%d,\"rate_target\":%s,\"mode\":\"%s\",\"conn_mode\":\"persistent\",\"mix\":\"lock-unlock\",\"keys\":%d,\"dist\":\"%s\",\"hold_us\":%.3f,\"duration_s\":%.3f,\"warmup_s\":%.3f,",
			jsonStr("etcd://"+strings.Join(cfg.endpoints, ",")), jsonStr(cfg.label), cfg.connections, runtime.GOMAXPROCS(0), strconv.FormatFloat(cfg.rate, 'f', -1, 64), rateMode,
			cfg.keys, cfg.dist, float64(cfg.holdNs)/1e3, float64(cfg.durationNs)/1e9, float64(cfg.warmupNs)/1e9)
		b.WriteString("\"tls\":false,\"tls_client\":null,\"cycles_cap\":null,")
		firstErr := "null"
		if st.firstErr != "" {
			firstErr = jsonStr(st.firstErr)
		}
		e := &st.errs
		fmt.Fprintf(&b, "\"ops_per_sec\":%.1f,\"cycles\":%d,\"cycles_all\":%d,\"grants\":%d,\"busy\":0,\"retries\":0,\"connects\":%d,\"errors\":%d,\"error_detail\":{\"server\":%d,\"connect\":%d,\"tls\":%d,\"io\":%d,\"protocol\":%d,\"not_held\":%d,\"incomplete\":%d},\"first_error\":%s,\"fairness\":{\"min\":%d,\"max\":%d,\"jain\":%.4f},\"drain_s\":%.3f,\"run_start_mono_ns\":%d,\"run_end_mono_ns\":%d,\"loadgen_cpu_s\":{\"user\":%.3f,\"sys\":%.3f},",
			opsPerSec, st.cycles, st.cyclesAll, st.grants, st.connects, e.total(), e.server, e.connect, e.tls, e.io, e.protocol, e.notHeld, e.incomplete,
			firstErr, gmin, gmax, jain, float64(drain)/1e9, start, endedNs, cpuUser, cpuSys)
		jsonHist(&b, "latency_us", st.lock)
		b.WriteByte(',')
		// latency_us starts the clock at the cycle's intended start (open
		// loop: its slot in the schedule), the uncorrected figure at the
		// Lock's send, as ringlock-loadgen does.
		jsonHist(&b, "latency_uncorrected_us", st.lockUncorrected)
		b.WriteByte(',')
		jsonHist(&b, "unlock_us", st.unlock)
		b.WriteByte(',')
		jsonHist(&b, "cycle_us", st.cycle)
		b.WriteByte(',')
		jsonHist(&b, "queue_wait_us", st.queueWait)
		b.WriteByte(',')
		jsonHist(&b, "handoff_us", st.handoff)
		b.WriteByte(',')
		jsonHist(&b, "handshake_us", st.handshake)
		b.WriteString(",\"curve_us\":[")
		for i, p := range curve {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "[%g,%.3f]", p, pct(st.lock, p))
		}
		b.WriteString("]")
		// Extra fields (after ringlock-loadgen's, none of whose names they
		// contain): which client produced the line.
		fmt.Fprintf(&b, ",\"client_impl\":%s,\"grpc_conns\":%d}", jsonStr("etcd clientv3 concurrency.Mutex ("+runtime.Version()+")"), len(clients))
		fmt.Println(b.String())
	}
	if st.cyclesAll == 0 && st.grants == 0 && st.errs.total() > 0 {
		fmt.Fprintf(os.Stderr, "error: every request failed: %d errors; first error: %s\n", st.errs.total(), st.firstErr)
		os.Exit(1)
	}
}
