// cpu.go: what a phase of a run costs in CPU time, of the outboxd
// processes and of the PostgreSQL backends serving the run's database,
// and how busy the machine was, read from /proc (Linux).

package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cpuMeter adds up the CPU time one phase of a run costs: that of the
// outboxd processes under test and of the PostgreSQL backends serving the
// run's database, read from /proc. On a shared machine a rate moves with
// whatever else runs; the CPU time a phase costs moves far less, so two
// builds compare by it as well as by their rates. It needs Linux and the server on this machine; elsewhere it
// reports nothing.
//
// A backend's time counts from the phase's start (its time then is the
// baseline) to its last sample: the meter samples every cpuSampleEvery,
// so a connection the pool closes mid-phase keeps nearly all it spent. A
// backend that begins mid-phase has no baseline: all its time counts,
// from its start, which is within the phase.
// The server's own processes (WAL writer, checkpointer) are not counted,
// nor the generator's own process; its producers' backends are.
//
// The meter asks for the backends on a connection of its own, held for
// the phase: the one backend its query leaves out is then always its
// own. On a connection taken from the pool at each sample, the backend
// left out would be whichever producer's connection the pool lent it,
// missing from that sample, and counted from its start, warm-up and all,
// had it been lent for the baseline.
//
// bench/river/cpu.go holds a copy of this meter, parseCPUTime and
// cpuWindow, for River's side of compare's cpu pair (a module of its own,
// so no package is shared): change both alike.
type cpuMeter struct {
	conn      *sql.Conn // the meter's own connection; nil if none could be had
	stop      chan struct{}
	done      chan struct{}
	mu        sync.Mutex            // protects the fields below
	processes []int                 // outboxd's pids, added once started
	base      map[int]time.Duration // backends' CPU time at the start
	last      map[int]time.Duration // every pid's CPU time at its last sample
}

// cpuSampleEvery is how often the meter reads /proc.
const cpuSampleEvery = 250 * time.Millisecond

// backendPIDsSQL lists the client backends of the run's database.
const backendPIDsSQL = `
SELECT pid FROM pg_stat_activity
WHERE datname = current_database()
  AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()`

// startCPUMeter takes the baseline and starts sampling.
func startCPUMeter(ctx context.Context, db *sql.DB) *cpuMeter {
	m := &cpuMeter{stop: make(chan struct{}), done: make(chan struct{}),
		base: map[int]time.Duration{}, last: map[int]time.Duration{}}
	m.conn, _ = db.Conn(ctx) // nil on error: the backends' time stays unknown
	pids, _ := m.backendPIDs(ctx)
	for _, pid := range pids {
		if t, ok := readCPUTime(pid); ok {
			m.base[pid] = t
		}
	}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(cpuSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-m.stop:
				return
			case <-tick.C:
				m.sample(ctx)
			}
		}
	}()
	return m
}

// backendPIDs runs backendPIDsSQL on the meter's connection.
func (m *cpuMeter) backendPIDs(ctx context.Context) ([]int, error) {
	if m.conn == nil {
		return nil, sql.ErrConnDone
	}
	rows, err := m.conn.QueryContext(ctx, backendPIDsSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, rows.Err()
}

// addProcess counts an outboxd process from now on: what it spent
// before (its start, or a phase before this one) is its baseline.
func (m *cpuMeter) addProcess(pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.processes = append(m.processes, pid)
	if t, ok := readCPUTime(pid); ok {
		m.base[pid] = t
	}
}

func (m *cpuMeter) sample(ctx context.Context) {
	pids, err := m.backendPIDs(ctx)
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, pid := range append(pids, m.processes...) {
		if t, ok := readCPUTime(pid); ok {
			m.last[pid] = t
		}
	}
}

// Stop takes a last sample and reports the phase's CPU time: outboxd's
// and the backends'; ok is false where /proc had neither (a server on
// another machine leaves the backends' at zero).
func (m *cpuMeter) Stop(ctx context.Context) (outboxd, backends time.Duration, ok bool) {
	close(m.stop)
	<-m.done
	m.sample(ctx)
	if m.conn != nil {
		m.conn.Close()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for pid, t := range m.last {
		if slices.Contains(m.processes, pid) {
			outboxd += t - m.base[pid]
		} else {
			backends += t - m.base[pid]
		}
	}
	return outboxd, backends, outboxd > 0 && backends > 0
}

// Report is the line a mode prints after its rate: the phase's CPU time
// in all and per unit of work (an event, a job).
func (m *cpuMeter) Report(ctx context.Context, units int, unit string) string {
	outboxd, backends, ok := m.Stop(ctx)
	if !ok {
		return "CPU time: unknown (no /proc for outboxd or the server's backends)"
	}
	total := outboxd + backends
	return fmt.Sprintf("CPU time: outboxd %.2f s, PostgreSQL backends %.2f s: %.3f ms per %s",
		outboxd.Seconds(), backends.Seconds(), float64(total.Microseconds())/1000/float64(units), unit)
}

// clockTicksPerSecond is Linux's USER_HZ, the unit of /proc/PID/stat's
// times: 100 on every architecture Go supports there.
const clockTicksPerSecond = 100

// readCPUTime is a process's user and system time so far, from
// /proc/PID/stat; its fields 14 and 15, counted after the command name,
// which is in parentheses and may hold spaces.
func readCPUTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	return parseCPUTime(string(b))
}

// parseCPUTime reads the user and system time of a /proc/PID/stat line.
func parseCPUTime(stat string) (time.Duration, bool) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, false
	}
	fields := strings.Fields(stat[end+1:]) // from field 3, the state
	if len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicksPerSecond, true
}

// machineCPU reads the machine's CPU time from /proc/stat: the time every
// CPU was busy and the time that passed on all of them together, in clock
// ticks; ok false where there is no /proc. Two readings give the share of
// the machine a phase kept busy, whoever kept it so.
func machineCPU() (busy, total int64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i != 3 && i != 4 { // idle and iowait
			busy += n
		}
	}
	return busy, total, true
}

// cpuWindow is what a window metered after a warm-up cost (keepup's
// -warmup): the CPU time of the system's process and of the backends,
// and the events the receiver first saw in it.
type cpuWindow struct {
	Warmup, Window    time.Duration // as asked: the warm-up, then the window
	Elapsed           time.Duration // the window as the clock measured it
	Metered           bool          // Process and Backends were read from /proc
	Process, Backends time.Duration
	Delivered         int64 // distinct webhook-ids first seen in the window
}

// perEvent is the window's CPU time per delivered event in ms: in all,
// the backends' and the process's; ok false with no event delivered.
func (w cpuWindow) perEvent() (total, backends, process float64, ok bool) {
	if w.Delivered <= 0 {
		return 0, 0, 0, false
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(w.Delivered) }
	return per(w.Process + w.Backends), per(w.Backends), per(w.Process), true
}

// rate is the events delivered a second over the window.
func (w cpuWindow) rate() float64 {
	if w.Elapsed <= 0 {
		return 0
	}
	return float64(w.Delivered) / w.Elapsed.Seconds()
}

// line is the window's report; process names the system's process
// ("outboxd"). bench/river's compare reads it, and riverbench prints the
// same line with "river": keep the two formats alike.
func (w cpuWindow) line(process string) string {
	head := fmt.Sprintf("CPU window %s after a %s warm-up: delivered %d events, %.0f events/s", w.Window, w.Warmup, w.Delivered, w.rate())
	total, backends, proc, ok := w.perEvent()
	switch {
	case !w.Metered:
		return head + "; CPU time unknown (no /proc for " + process + " or the server's backends)"
	case !ok:
		return head + "; CPU per delivered event unknown (none delivered)"
	}
	return fmt.Sprintf("%s; CPU time %s %.2f s, PostgreSQL backends %.2f s: %.3f ms per delivered event (PostgreSQL backends %.3f ms, %s %.3f ms)",
		head, process, w.Process.Seconds(), w.Backends.Seconds(), total, backends, process, proc)
}
