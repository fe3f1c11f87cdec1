// go_trace_requests: a server of fake requests that sets pprof labels the
// way dd-trace-go does for each span it starts (`pprof.WithLabels`, then
// `pprof.SetGoroutineLabels`; keys "span id", "local root span id",
// "trace endpoint", decimal ids), for the trace context tests.
//
// Usage: go_trace_requests THREADS SECONDS
//
// Each of THREADS goroutines is locked to its own OS thread (so that a
// sample's thread id tells which goroutine ran) and serves requests: ~15 ms
// in request_work with its labels set, then ~5 ms in idle_work with the
// labels cleared. Request k of the goroutine on thread tid has span id
// tid<<24 | k and local root span id span | 1<<62, endpoint "GET /thread/TID".
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"
)

var sink uint64

//go:noinline
func spin(until time.Time) {
	x := sink
	for time.Now().Before(until) {
		for i := 0; i < 10000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink = x
}

//go:noinline
func request_work(d time.Duration) { spin(time.Now().Add(d)) }

//go:noinline
func idle_work(d time.Duration) { spin(time.Now().Add(d)) }

func serve(deadline time.Time, wg *sync.WaitGroup) {
	defer wg.Done()
	runtime.LockOSThread()
	tid := uint64(syscall.Gettid())
	background := context.Background()
	for k := uint64(1); time.Now().Before(deadline); k++ {
		span := tid<<24 | k
		root := span | 1<<62
		ctx := pprof.WithLabels(background, pprof.Labels(
			"span id", strconv.FormatUint(span, 10),
			"local root span id", strconv.FormatUint(root, 10),
			"trace endpoint", fmt.Sprintf("GET /thread/%d", tid),
		))
		pprof.SetGoroutineLabels(ctx)
		request_work(15 * time.Millisecond)
		pprof.SetGoroutineLabels(background)
		idle_work(5 * time.Millisecond)
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go_trace_requests THREADS SECONDS")
		os.Exit(2)
	}
	threads, _ := strconv.Atoi(os.Args[1])
	seconds, _ := strconv.Atoi(os.Args[2])
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	var wg sync.WaitGroup
	for i := 0; i < threads; i++ {
		wg.Add(1)
		go serve(deadline, &wg)
	}
	wg.Wait()
}
