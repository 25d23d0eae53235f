// child.go: the River client under test as a child process, started from
// this same binary as `riverbench work`, so that its peak resident memory
// (VmHWM) is its own, as bench/load measures the outboxd it starts.

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type child struct {
	cmd   *exec.Cmd
	ready chan struct{} // closed when the child prints "ready"
	done  chan struct{} // closed when the child's stdout ends

	mu    sync.Mutex // protects lines
	lines []string   // what the child printed, "ready" aside
}

// startChild runs `riverbench work` with cfg's settings and env added to
// this process's environment.
func startChild(cfg loadConfig, kind, url string, env []string, stderr io.Writer) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own binary: %w", err)
	}
	cmd := exec.Command(exe, "work", "-database-url", cfg.DatabaseURL, "-kind", kind, "-url", url,
		"-events", strconv.Itoa(cfg.Events), "-workers", strconv.Itoa(cfg.Workers), "-max-conns", strconv.Itoa(cfg.MaxConns),
		"-fetch-cooldown", cfg.FetchCooldown.String(), "-fetch-poll-interval", cfg.FetchPollInterval.String())
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start child: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child: %w", err)
	}
	c := &child{cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(c.ready)
				continue
			}
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.mu.Unlock()
		}
	}()
	return c, nil
}

// AwaitReady waits until the child's River client has started.
func (c *child) AwaitReady(ctx context.Context, timeout time.Duration) error {
	select {
	case <-c.ready:
		return nil
	case <-c.done:
		return errors.New("child exited before it was ready")
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("child not ready after %s", timeout)
	}
}

// Stop reads the child's peak memory, ends it with SIGTERM and returns the
// peak (kB) and the lines it printed.
func (c *child) Stop() (int64, []string) {
	peak := readVmHWM(c.cmd.Process.Pid)
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
	c.cmd.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return peak, c.lines
}

// readVmHWM is a process's peak resident set size in kB (Linux), 0 if
// unknown.
func readVmHWM(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

func rssText(kb int64) string {
	if kb == 0 {
		return "unknown (no /proc)"
	}
	return fmt.Sprintf("%.1f MiB", float64(kb)/1024)
}
