// devdb.go: the embedded default, a private PostgreSQL cluster started from
// the machine's PostgreSQL binaries when no DATABASE_URL is given. The test
// harness uses it too, for a throwaway cluster when no server is named.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cluster is a PostgreSQL server process that outboxd started and owns. It
// listens only on a Unix socket in its data folder: nothing on the network
// can reach it.
type cluster struct {
	dir    string // the data folder: pgdata/ and the socket live here
	cmd    *exec.Cmd
	exited chan struct{} // closed when the server process has exited
	logger *slog.Logger
}

// socketPathMax is the longest Unix socket path Linux accepts (sun_path is
// 108 bytes with its terminating NUL).
const socketPathMax = 107

// startCluster starts a private cluster in dir, creating it on first use,
// and waits until it accepts connections with a database named outboxd.
// settings are extra server settings ("fsync=off") for throwaway clusters.
func startCluster(ctx context.Context, dir string, logger *slog.Logger, settings ...string) (*cluster, error) {
	bin, err := findPostgresBin()
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded database: %w", err)
	}
	if n := len(dir) + len("/.s.PGSQL.5432"); n > socketPathMax {
		return nil, fmt.Errorf("embedded database: data folder %s is too long for a Unix socket path (%d > %d bytes); use a shorter -data-dir", dir, n, socketPathMax)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded database: create data folder: %w", err)
	}
	// PostgreSQL refuses to run as root; as root, run it as the postgres
	// user and give that user the folder.
	cred, err := serverCredential(dir)
	if err != nil {
		return nil, err
	}
	if cred != nil {
		// Said once, at start: the data folder's files now belong to
		// another user, which surprises whoever looks at them later.
		logger.Info("started as root: the private cluster runs PostgreSQL as the postgres OS user, which owns its data folder",
			"data_dir", dir, "uid", cred.Uid)
	}

	pgdata := filepath.Join(dir, "pgdata")
	if err := initCluster(ctx, bin, pgdata, cred, logger); err != nil {
		return nil, err
	}
	if pid, alive := runningPostmaster(pgdata); alive {
		return nil, fmt.Errorf("embedded database: %s is in use by PostgreSQL process %d (another outboxd?); stop it or use another -data-dir", pgdata, pid)
	}
	logPath := filepath.Join(dir, "postgres.log")
	c, err := launchServer(bin, dir, logPath, settings, cred, logger)
	if err != nil {
		return nil, err
	}
	if err := c.awaitReady(ctx, logPath); err != nil {
		c.Stop()
		return nil, err
	}
	logger.Info("embedded PostgreSQL started", "data_dir", pgdata, "socket_dir", dir, "log", logPath)
	return c, nil
}

// initCluster creates the cluster in pgdata with initdb, unless one is
// there.
func initCluster(ctx context.Context, bin, pgdata string, cred *syscall.Credential, logger *slog.Logger) error {
	_, err := os.Stat(filepath.Join(pgdata, "PG_VERSION"))
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("embedded database: %w", err)
	}
	logger.Info("creating embedded PostgreSQL cluster", "data_dir", pgdata, "bin", bin)
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", pgdata, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("embedded database: initdb: %w\n%s", err, out)
	}
	return nil
}

// launchServer starts postgres on dir's cluster, listening on a socket in
// dir only, its output appended to logPath.
func launchServer(bin, dir, logPath string, settings []string, cred *syscall.Credential, logger *slog.Logger) (*cluster, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedded database: open log: %w", err)
	}
	defer logFile.Close() // the child keeps its own descriptor

	// track_commit_timestamp lets the relay read when each event's
	// transaction committed, where the latency to its first 2xx starts
	// (schema.sql, outbox.commit_time); without it, the insert's clock.
	args := []string{"-D", filepath.Join(dir, "pgdata"), "-k", dir, "-c", "listen_addresses=", "-c", "port=5432",
		"-c", "track_commit_timestamp=on"}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	// Not CommandContext: the server must outlive ctx long enough for
	// outboxd to finish its shutdown, and is stopped by Stop.
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = serverProcAttr(cred)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("embedded database: start postgres: %w", err)
	}
	c := &cluster{dir: dir, cmd: cmd, exited: make(chan struct{}), logger: logger}
	go func() {
		cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// DSN is a connection string for database dbname on the cluster's socket.
func (c *cluster) DSN(dbname string) string {
	return fmt.Sprintf("host=%s port=5432 user=postgres dbname=%s sslmode=disable", c.dir, dbname)
}

// awaitReady waits until the server accepts connections, then creates the
// outboxd database if it is missing.
func (c *cluster) awaitReady(ctx context.Context, logPath string) error {
	db, err := sql.Open("postgres", c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("embedded database: %w", err)
	}
	defer db.Close()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if err = db.PingContext(ctx); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.exited:
			return fmt.Errorf("embedded database: postgres exited at start; its log %s ends:\n%s", logPath, tail(logPath, 20))
		case <-deadline.C:
			return fmt.Errorf("embedded database: not ready after 60s: %w; its log %s ends:\n%s", err, logPath, tail(logPath, 20))
		case <-tick.C:
		}
	}
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'outboxd')`).Scan(&exists); err != nil {
		return fmt.Errorf("embedded database: %w", err)
	}
	if !exists {
		if _, err := db.ExecContext(ctx, `CREATE DATABASE outboxd`); err != nil {
			return fmt.Errorf("embedded database: create database: %w", err)
		}
	}
	return nil
}

// Stop shuts the server down with PostgreSQL's fast shutdown (roll back open
// transactions, checkpoint, exit) and waits for it; after 30 s it is killed,
// and the next start recovers from the WAL.
func (c *cluster) Stop() {
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		return // already gone
	}
	select {
	case <-c.exited:
		c.logger.Info("embedded PostgreSQL stopped")
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
		c.logger.Warn("embedded PostgreSQL killed after 30s")
	}
}

// findPostgresBin finds the folder holding initdb and postgres: on PATH,
// else the newest /usr/lib/postgresql/N/bin (Debian and Ubuntu keep the
// server binaries off PATH).
func findPostgresBin() (string, error) {
	if p, err := exec.LookPath("postgres"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	candidates, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	sort.Slice(candidates, func(i, j int) bool {
		return pgMajor(candidates[i]) > pgMajor(candidates[j])
	})
	for _, p := range candidates {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("no PostgreSQL server found (initdb and postgres, on PATH or in /usr/lib/postgresql/*/bin): " +
		"install it (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql) or set DATABASE_URL")
}

// pgMajor is N of /usr/lib/postgresql/N/bin/postgres.
func pgMajor(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

// serverCredential is nil when outboxd may run PostgreSQL as itself, and the
// postgres user's credential when outboxd runs as root, after handing it dir.
func serverCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("embedded database: running as root needs a postgres OS user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	err = filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
	if err != nil {
		return nil, fmt.Errorf("embedded database: give %s to the postgres user: %w", dir, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// runningPostmaster reports the pid in pgdata/postmaster.pid if that process
// is alive. A stale file from a crash is left for PostgreSQL to handle.
func runningPostmaster(pgdata string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 0 {
		return 0, false
	}
	err = syscall.Kill(pid, 0)
	return pid, err == nil || errors.Is(err, syscall.EPERM)
}

// tail is the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
