// Command ferry runs the ferry outbox relay, workers and the sample
// notification service; see package ferrycli for the commands and flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ferrycli.Main(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
