// Command pubsub-emulator serves Google's in-memory Pub/Sub fake
// (cloud.google.com/go/pubsub/v2/pstest) as a plain-text gRPC server for local
// end-to-end tests. Point clients at it with PUBSUB_EMULATOR_HOST=<host>:<port>.
//
//	pubsub-emulator -host 127.0.0.1 -port 8085
//
// Prints "pubsub-emulator listening on <host>:<port>" to stdout once the port
// accepts connections, and exits 0 on SIGTERM or SIGINT. State is in memory only.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"cloud.google.com/go/pubsub/v2/pstest"
)

func main() {
	host := flag.String("host", "127.0.0.1", "address to bind")
	port := flag.Int("port", 8085, "TCP port to listen on (0 picks a free port; the ready line shows it)")
	flag.Parse()

	var srv *pstest.Server
	func() {
		// pstest panics when it cannot listen; turn that into a clean error exit.
		defer func() {
			if r := recover(); r != nil {
				log.Fatalf("pubsub-emulator: %v", r)
			}
		}()
		srv = pstest.NewServerWithAddress(net.JoinHostPort(*host, strconv.Itoa(*port)))
	}()
	fmt.Printf("pubsub-emulator listening on %s\n", srv.Addr)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	fmt.Printf("pubsub-emulator: %v, shutting down\n", s)
	if err := srv.Close(); err != nil {
		log.Printf("pubsub-emulator: close: %v", err)
	}
}
