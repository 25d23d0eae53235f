// outboxd.go: the outboxd under test, the binary named by -outboxd run as
// a child process, and what the generator knows of its settings.

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// child is one outboxd process under test. Its address is chosen at the
// first start and kept across restarts.
type child struct {
	bin, dsn, token string
	extra           []string // -serve-flags
	stderr          io.Writer
	addr            string
	cmd             *exec.Cmd
	exited          chan struct{} // closed when cmd has exited; exitErr is then set
	exitErr         error
	peakRSS         int64 // kB, the largest VmHWM seen across restarts
}

// readyWait bounds a child's start: migrations on a fresh database and
// the pool's first connections take well under a second.
const readyWait = 60 * time.Second

// Start starts the child and waits until /readyz answers 200, or the
// child exits, or readyWait passes.
func (c *child) Start(ctx context.Context) error {
	if c.addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("choose outboxd's address: %w", err)
		}
		c.addr = ln.Addr().String()
		ln.Close()
	}
	args := append([]string{"-database-url", c.dsn, "-addr", c.addr, "-admin-token", c.token,
		"-allow-private-endpoints", "-log-level", "warn"}, c.extra...)
	c.cmd = exec.Command(c.bin, args...)
	c.cmd.Stdout, c.cmd.Stderr = io.Discard, c.stderr
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("start outboxd: %w", err)
	}
	// One Wait, here, so that awaitReady learns of an early exit (a
	// refused setting) at once instead of after readyWait.
	cmd, exited := c.cmd, make(chan struct{})
	c.exited = exited
	go func() {
		c.exitErr = cmd.Wait()
		close(exited)
	}()
	return c.awaitReady(ctx)
}

func (c *child) awaitReady(ctx context.Context) error {
	deadline := time.Now().Add(readyWait)
	for {
		resp, err := http.Get("http://" + c.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("outboxd not ready after %s", readyWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.exited:
			c.cmd = nil
			return fmt.Errorf("outboxd exited before it was ready (%v); its output is above", c.exitErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Running says whether the child was started and not stopped since.
func (c *child) Running() bool { return c.cmd != nil && c.cmd.Process != nil }

// Stop ends the child with SIGTERM, noting its peak memory first.
func (c *child) Stop() {
	if !c.Running() {
		return
	}
	c.peakRSS = max(c.peakRSS, readVmHWM(c.cmd.Process.Pid))
	c.cmd.Process.Signal(syscall.SIGTERM)
	<-c.exited
	c.cmd = nil
}

// PeakRSS is outboxd's high-water resident memory, from /proc (Linux).
func (c *child) PeakRSS() string {
	if c.Running() {
		c.peakRSS = max(c.peakRSS, readVmHWM(c.cmd.Process.Pid))
	}
	if c.peakRSS == 0 {
		return "unknown (no /proc)"
	}
	return fmt.Sprintf("%.1f MiB", float64(c.peakRSS)/1024)
}

// readVmHWM is a process's peak resident set in kB, from
// /proc/PID/status; 0 where there is none.
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

// outboxd's defaults for the settings the generator reads, as `outboxd
// -h` prints them.
const (
	defaultWorkers          = 128
	defaultBreakerThreshold = 5
)

// childSetting is the integer setting name of a child started with the
// flags extra, as the child reads it: the flag (-name or --name, with = or
// a separate value) if given, else its environment fallback (the child
// inherits this process's environment), else def. A value that is not a
// positive number gives def here; the child then refuses to start and
// names the setting.
func childSetting(extra []string, getenv func(string) string, name string, def int) int {
	if n, err := strconv.Atoi(getenv(envName(name))); err == nil && n >= 1 {
		def = n
	}
	return serveFlagInt(extra, name, def)
}

// envName is a flag's environment fallback as outboxd names it:
// OUTBOXD_WORKERS for -workers.
func envName(flagName string) string {
	return "OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// childWorkers is a child's -workers.
func childWorkers(extra []string, getenv func(string) string) int {
	return childSetting(extra, getenv, "workers", defaultWorkers)
}

// serveFlagInt is the integer flag name among a child's flags, the last
// one given winning as in package flag; def if absent or not a number.
func serveFlagInt(extra []string, name string, def int) int {
	v := def
	for i, a := range extra {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		var val string
		switch {
		case a == name && i+1 < len(extra):
			val = extra[i+1]
		case strings.HasPrefix(a, name+"="):
			val = strings.TrimPrefix(a, name+"=")
		default:
			continue
		}
		if n, err := strconv.Atoi(val); err == nil && n >= 1 {
			v = n
		}
	}
	return v
}
