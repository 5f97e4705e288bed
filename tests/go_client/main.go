// Command go_client drives the plugin the way Nomad's grpc-go client does (insecure h2c over
// a unix socket, authority "localhost", a blocking dial with a 1 s timeout), for the
// connection-churn regression test: many connections, each carrying many calls, then closed.
//
// It needs no generated code: requests and responses are raw protobuf bytes.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// rawCodec passes []byte through, so calls need no message types.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// probeReady is ProbeResponse{ready: BoolValue{value: true}} on the wire.
var probeReady = []byte{0x0a, 0x02, 0x08, 0x01}

func main() {
	socket := flag.String("socket", "", "unix socket of the plugin")
	connections := flag.Int("connections", 20, "connections to open one after another")
	calls := flag.Int("calls", 500, "calls per connection")
	parallel := flag.Int("parallel", 8, "calls in flight per connection")
	flag.Parse()
	encoding.RegisterCodec(rawCodec{})

	total := 0
	start := time.Now()
	for c := 0; c < *connections; c++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := grpc.DialContext(ctx, "unix://"+*socket,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithAuthority("localhost"),
			grpc.WithBlock(),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
		)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "connection %d: dial: %v\n", c, err)
			os.Exit(1)
		}
		var wg sync.WaitGroup
		errs := make(chan error, *calls)
		sem := make(chan struct{}, *parallel)
		for i := 0; i < *calls; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req := []byte{}
				var resp []byte
				method := "/csi.v1.Identity/Probe"
				if i%2 == 1 {
					method = "/csi.v1.Node/NodeGetInfo"
				}
				if err := conn.Invoke(ctx, method, &req, &resp); err != nil {
					errs <- fmt.Errorf("%s: %w", method, err)
					return
				}
				if i%2 == 0 && !bytes.Equal(resp, probeReady) {
					errs <- fmt.Errorf("Probe answered %x, want %x", resp, probeReady)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			fmt.Fprintf(os.Stderr, "connection %d: %v\n", c, err)
			os.Exit(1)
		}
		total += *calls
		if err := conn.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "connection %d: close: %v\n", c, err)
			os.Exit(1)
		}
	}
	fmt.Printf("calls=%d connections=%d seconds=%.2f\n", total, *connections, time.Since(start).Seconds())
}
