package ferrycli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// TestMain lets the test binary stand in for the ferry binary: ferry
// bench's faults scenario starts `ferry bench-child` as a child process,
// and under test that child is this binary with FERRY_TEST_RUN_MAIN=1,
// which runs Main instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("FERRY_TEST_RUN_MAIN") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := Main(ctx, append([]string{"ferry"}, os.Args[1:]...), os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	benchChildEnv = []string{"FERRY_TEST_RUN_MAIN=1"}
	os.Exit(m.Run())
}
