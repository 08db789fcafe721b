// kvcost measures what one JetStream KV put costs nats-server, in CPU µs per put (utime + stime
// from /proc over the measured puts), for a given nats-server binary, value size and way of
// publishing. It starts its own nats-server (-js, a temporary store, a free port), creates a
// bucket (history 1 and file storage as the worker's cache bucket, but without its byte and age
// limits), warms it with 2,000 puts, then measures.
//
// Usage: go run . NATS_SERVER_BIN PUTS VALUE_BYTES MODE [BURST EVERY]
//
//	MODE seq:   one put at a time, each waiting for its acknowledgement (a lone writer)
//	MODE async: every put published at once, the acknowledgements awaited at the end (the
//	            deepest pipeline: the server's floor per message)
//	MODE burst: BURST puts published together, their acknowledgements awaited, one burst every
//	            EVERY (a Go duration), e.g. 9 puts every 3172us is 2,837 puts/s in bursts of a
//	            worker's batch
//
// Prints one line: the server's version, the mode, wall time per put and the server's CPU per
// put. Linux only (/proc). Used for docs/design/cache.md.
package main

import (
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

func must(err error, what string) {
	if err != nil {
		log.Fatalf("%s: %v", what, err)
	}
}

// cpuMicros is the process's utime + stime in µs (/proc/PID/stat, 100 clock ticks a second).
func cpuMicros(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	must(err, "reading nats-server's /proc stat")
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	u, err := strconv.ParseFloat(f[11], 64)
	must(err, "utime")
	k, err := strconv.ParseFloat(f[12], 64)
	must(err, "stime")
	return (u + k) * 10_000
}

func intArg(i int, name string) int {
	v, err := strconv.Atoi(os.Args[i])
	must(err, name)
	return v
}

func main() {
	if len(os.Args) < 5 {
		log.Fatal("usage: kvcost NATS_SERVER_BIN PUTS VALUE_BYTES seq|async|burst [BURST EVERY]")
	}
	bin, n, size, mode := os.Args[1], intArg(2, "PUTS"), intArg(3, "VALUE_BYTES"), os.Args[4]
	burst, every := 1, time.Duration(0)
	if mode == "burst" {
		if len(os.Args) < 7 {
			log.Fatal("burst needs BURST and EVERY")
		}
		burst = intArg(5, "BURST")
		var err error
		every, err = time.ParseDuration(os.Args[6])
		must(err, "EVERY")
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err, "finding a free port")
	port := l.Addr().(*net.TCPAddr).Port
	must(l.Close(), "freeing the port")
	dir, err := os.MkdirTemp("", "kvcost")
	must(err, "temporary store")
	defer os.RemoveAll(dir)
	server := exec.Command(bin, "-js", "-sd", dir, "-p", strconv.Itoa(port), "-a", "127.0.0.1")
	must(server.Start(), "starting nats-server")
	defer server.Process.Kill()

	var nc *nats.Conn
	for i := 0; i < 100; i++ {
		if nc, err = nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port)); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	must(err, "connecting")
	defer nc.Close()
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(1024))
	must(err, "JetStream context")
	kv, err := js.CreateKeyValue(&nats.KeyValueConfig{Bucket: "kvcost", History: 1})
	must(err, "creating the bucket")
	val := make([]byte, size)
	for i := range val {
		val[i] = byte('a' + i%26)
	}
	for i := 0; i < 2000; i++ {
		_, err := kv.Put(fmt.Sprintf("warm%d", i), val)
		must(err, "warm-up put")
	}

	cpu0, t0 := cpuMicros(server.Process.Pid), time.Now()
	switch mode {
	case "seq":
		for i := 0; i < n; i++ {
			_, err := kv.Put(fmt.Sprintf("k%d", i), val)
			must(err, "put")
		}
	case "async", "burst":
		if mode == "async" {
			burst = n
		}
		next := time.Now()
		for i := 0; i < n; {
			for j := 0; j < burst && i < n; j, i = j+1, i+1 {
				_, err := js.PublishAsync(fmt.Sprintf("$KV.kvcost.k%d", i), val)
				must(err, "publish")
			}
			<-js.PublishAsyncComplete()
			next = next.Add(every)
			time.Sleep(time.Until(next))
		}
	default:
		log.Fatalf("MODE %q: expected seq, async or burst", mode)
	}
	wall, cpu := time.Since(t0), cpuMicros(server.Process.Pid)-cpu0

	version, err := exec.Command(bin, "--version").Output()
	must(err, "nats-server --version")
	fmt.Printf("%s mode=%s burst=%d every=%s value=%dB puts=%d wall/put=%.1fus server-cpu/put=%.1fus\n",
		strings.TrimSpace(string(version)), mode, burst, every, size, n,
		float64(wall.Microseconds())/float64(n), cpu/float64(n))
}
