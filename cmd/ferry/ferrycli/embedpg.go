package ferrycli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
	"github.com/jackc/pgx/v5"
)

// embeddedPGVersion is the PostgreSQL version the embedded server runs.
const embeddedPGVersion = embeddedpostgres.V18

// embeddedPG is a PostgreSQL server started by ferry on a loopback port:
// real PostgreSQL binaries from github.com/fergusstrange/embedded-postgres,
// downloaded once and cached in ~/.embedded-postgres-go.
type embeddedPG struct {
	url  string
	stop func() error
	dir  string
}

// URL is the connection URL of database ferry (user ferry, password ferry).
func (e *embeddedPG) URL() string { return e.url }

// Stop stops the server and waits for it; the data directory stays when it
// is under --data-dir and is removed when it was a temporary one.
func (e *embeddedPG) Stop() error { return e.stop() }

// startEmbeddedPG starts PostgreSQL with its data in dataDir/postgres.
// PostgreSQL refuses to run as root; when ferry runs as root the server
// runs as user nobody instead, in a folder that user can reach.
func startEmbeddedPG(ctx context.Context, dataDir string, log *slog.Logger) (*embeddedPG, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		return startEmbeddedPGAsNobody(ctx, dataDir, port, log)
	}
	logFile, err := os.Create(filepath.Join(dataDir, "postgres.log"))
	if err != nil {
		return nil, fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
	}
	cfg := embeddedpostgres.DefaultConfig().
		Version(embeddedPGVersion).
		Port(uint32(port)).
		Database("ferry").Username("ferry").Password("ferry").
		RuntimePath(filepath.Join(dataDir, "postgres-runtime")).
		DataPath(filepath.Join(dataDir, "postgres")).
		StartParameters(map[string]string{"listen_addresses": "127.0.0.1", "max_connections": "200", "wal_level": "logical"}).
		StartTimeout(2 * time.Minute).
		Logger(logFile)
	db := embeddedpostgres.NewDatabase(cfg)
	log.Info("starting embedded PostgreSQL (downloads the binaries once into ~/.embedded-postgres-go)", "port", port, "data", filepath.Join(dataDir, "postgres"))
	removeLogs, err := startRemovingTempLogs(db.Start)
	if err != nil {
		removeLogs()
		logFile.Close()
		return nil, fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
	}
	return &embeddedPG{
		url: fmt.Sprintf("postgres://ferry:ferry@127.0.0.1:%d/ferry?sslmode=disable", port),
		dir: dataDir,
		stop: func() error {
			defer logFile.Close()
			defer removeLogs() // after Stop, which copies the rest of the file to logFile
			return db.Stop()
		},
	}, nil
}

// pgTempLogPrefix begins the name of the file that embedded-postgres
// creates at every Start with os.CreateTemp("", pgTempLogPrefix), in the
// system temp folder, for initdb's and pg_ctl's output (copied to the
// configured Logger). The library (v1.34.0) has no option for where the
// file goes and never removes it; startRemovingTempLogs does.
const pgTempLogPrefix = "embedded_postgres_log"

// startRemovingTempLogs runs start (an embedded-postgres Start) and
// returns a function that removes the temp log files start created: the
// ones this process has open after start and did not have open before
// (read from /proc/self/fd; where that does not exist, as on macOS,
// nothing is found and the files stay). Call the function once the
// library no longer reads the file: after Stop, or at once when start
// failed. Two Starts running at once in one process would each remove
// the other's file too, which only loses that file's last lines.
func startRemovingTempLogs(start func() error) (remove func(), err error) {
	before := openPGTempLogs()
	err = start()
	var created []string
	for p := range openPGTempLogs() {
		if !before[p] {
			created = append(created, p)
		}
	}
	return func() {
		for _, p := range created {
			_ = os.Remove(p)
		}
	}, err
}

// openPGTempLogs returns the paths of the embedded-postgres temp log files
// this process has open.
func openPGTempLogs() map[string]bool {
	const fdDir = "/proc/self/fd"
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil
	}
	open := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if err == nil && strings.HasPrefix(filepath.Base(target), pgTempLogPrefix) && !strings.HasSuffix(target, " (deleted)") {
			open[target] = true
		}
	}
	return open
}

// startEmbeddedPGAsNobody runs initdb and pg_ctl as user nobody. The
// binaries come from embedded-postgres's cache: when they are not yet
// extracted, the library downloads and extracts them and then stops at
// initdb (which refuses root); ferry takes over from there.
func startEmbeddedPGAsNobody(ctx context.Context, dataDir string, port int, log *slog.Logger) (*embeddedPG, error) {
	nobody, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("ferry: embedded PostgreSQL: running as root, and PostgreSQL refuses root: no user nobody to run it as: %w", err)
	}
	uid, _ := strconv.ParseUint(nobody.Uid, 10, 32)
	gid, _ := strconv.ParseUint(nobody.Gid, 10, 32)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}

	binDir := filepath.Join(os.TempDir(), "ferry-embedded-postgres-"+string(embeddedPGVersion))
	if err := ensurePGBinaries(binDir); err != nil {
		return nil, err
	}

	// The data folder must be reachable by nobody: under --data-dir when
	// every folder above it lets others in, else a temporary folder.
	base, temporary := dataDir, false
	if !reachableByOthers(base) {
		base, err = os.MkdirTemp("", "ferry-postgres-")
		if err != nil {
			return nil, fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
		}
		temporary = true
		if err := os.Chmod(base, 0o755); err != nil {
			return nil, fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
		}
	}
	pgData := filepath.Join(base, "postgres")
	cleanup := func() {
		if temporary {
			_ = os.RemoveAll(base)
		}
	}
	if err := os.MkdirAll(pgData, 0o700); err != nil {
		cleanup()
		return nil, fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
	}
	if err := chownTree(pgData, int(uid), int(gid)); err != nil {
		cleanup()
		return nil, fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
	}
	log.Info("starting embedded PostgreSQL as user nobody (PostgreSQL refuses root)", "port", port, "data", pgData)

	run := func(ctx context.Context, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "bin", name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		cmd.Dir = base
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("ferry: embedded PostgreSQL: %s: %w\n%s", name, err, bytes.TrimSpace(out.Bytes()))
		}
		return nil
	}
	if _, err := os.Stat(filepath.Join(pgData, "PG_VERSION")); err != nil {
		pw := filepath.Join(pgData, "..", "pwfile-"+strconv.Itoa(port))
		if err := os.WriteFile(pw, []byte("ferry"), 0o600); err != nil {
			cleanup()
			return nil, fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
		}
		_ = os.Chown(pw, int(uid), int(gid))
		err := run(ctx, "initdb", "-A", "password", "-U", "ferry", "-D", pgData, "--pwfile="+pw, "-E", "UTF8", "--no-instructions", "--no-sync")
		_ = os.Remove(pw)
		if err != nil {
			cleanup()
			return nil, err
		}
	}
	// wal_level=logical: ferry demo --relay-mode=wal reads the outbox
	// from the WAL (the role is the superuser, so it may replicate).
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=200 -c wal_level=logical", port)
	// pg_ctl start is not cancelled with ctx: killed while it waits, it
	// would leave the server it forked running with nobody to stop it.
	if err := run(context.WithoutCancel(ctx), "pg_ctl", "start", "-w", "-t", "120", "-D", pgData, "-l", filepath.Join(pgData, "server.log"), "-o", opts); err != nil {
		cleanup()
		return nil, err
	}
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := run(ctx, "pg_ctl", "stop", "-w", "-m", "fast", "-D", pgData)
		cleanup()
		return err
	}
	if err := ctx.Err(); err != nil {
		_ = stop()
		return nil, err
	}
	url := fmt.Sprintf("postgres://ferry:ferry@127.0.0.1:%d/ferry?sslmode=disable", port)
	if err := createDatabaseIfMissing(ctx, fmt.Sprintf("postgres://ferry:ferry@127.0.0.1:%d/postgres?sslmode=disable", port), "ferry"); err != nil {
		_ = stop()
		return nil, err
	}
	return &embeddedPG{url: url, dir: base, stop: stop}, nil
}

// ensurePGBinaries makes sure binDir/bin/pg_ctl exists, letting
// embedded-postgres download (once, into its cache) and extract them. The
// binaries are extracted beside binDir and renamed into place, so a run
// killed half-way never leaves a partial binDir behind.
func ensurePGBinaries(binDir string) error {
	pgCtl := filepath.Join(binDir, "bin", "pg_ctl")
	if _, err := os.Stat(pgCtl); err == nil {
		return nil
	}
	runtime, err := os.MkdirTemp(filepath.Dir(binDir), "ferry-postgres-extract-")
	if err != nil {
		return fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
	}
	defer os.RemoveAll(runtime)
	extracted := filepath.Join(runtime, "binaries")
	cfg := embeddedpostgres.DefaultConfig().
		Version(embeddedPGVersion).
		BinariesPath(extracted).
		RuntimePath(filepath.Join(runtime, "runtime")).
		DataPath(filepath.Join(runtime, "data")).
		Logger(io.Discard)
	if p, err := freePort(); err == nil {
		cfg = cfg.Port(uint32(p))
	}
	// As root, Start downloads and extracts the binaries, then fails at
	// initdb ("cannot be run as root"); only the binaries are wanted here.
	removeLogs, startErr := startRemovingTempLogs(embeddedpostgres.NewDatabase(cfg).Start)
	removeLogs() // as root Start stops at initdb: the library reads its log file no more
	if _, err := os.Stat(filepath.Join(extracted, "bin", "pg_ctl")); err != nil {
		return fmt.Errorf("ferry: embedded PostgreSQL: binaries not extracted: %w", errors.Join(startErr, err))
	}
	if err := os.Chmod(extracted, 0o755); err != nil {
		return fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
	}
	if err := os.Rename(extracted, binDir); err != nil {
		// Another ferry may have put them in place meanwhile.
		if _, statErr := os.Stat(pgCtl); statErr != nil {
			return fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
		}
	}
	return nil
}

// reachableByOthers reports whether every folder from / down to dir lets
// other users traverse it.
func reachableByOthers(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

func chownTree(root string, uid, gid int) error {
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// createDatabaseIfMissing creates database name on the server of adminURL.
func createDatabaseIfMissing(ctx context.Context, adminURL, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("ferry: embedded PostgreSQL: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("ferry: embedded PostgreSQL: %w", err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("ferry: embedded PostgreSQL: create database %s: %w", name, err)
	}
	return nil
}
