// notify.go: wake-ups, one LISTEN connection that turns PostgreSQL
// notifications into pokes for the relay and the workers.
//
// A notification is a hint, never the truth: the relay and the workers also
// run on their own tickers, so a lost notification costs latency, not an
// event. That is why nothing here queues notifications: a wake-up channel
// holds at most one pending poke, and any number of notifications while a
// pass runs fold into one more pass.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/lib/pq"
)

// wakeups are the pokes for the relay (events) and the workers (jobs).
type wakeups struct {
	events chan struct{}
	jobs   chan struct{}
}

func newWakeups() *wakeups {
	return &wakeups{events: make(chan struct{}, 1), jobs: make(chan struct{}, 1)}
}

// poke leaves one pending wake-up on ch without ever blocking.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// all wakes everyone, after a reconnect: notifications sent while the
// connection was down are gone, so every loop should look now.
func (w *wakeups) all() {
	poke(w.events)
	poke(w.jobs)
}

const (
	// listenerPingInterval and listenerPingTimeout bound how long a half-open
	// LISTEN connection (a failover, a NAT dropping state) goes unnoticed:
	// without a ping, no error surfaces until TCP gives up, minutes to hours
	// later.
	listenerPingInterval = 30 * time.Second
	listenerPingTimeout  = 5 * time.Second
	// listenerRetryPause is the pause before a new listener after one failed.
	listenerRetryPause = time.Second
)

// listener owns the LISTEN connection. It is not from the pool: a pooled
// connection is reused by others and LISTEN is a session state.
type listener struct {
	dsn    string
	wake   *wakeups
	logger *slog.Logger
}

func newListener(dsn string, wake *wakeups, logger *slog.Logger) *listener {
	return &listener{dsn: dsn, wake: wake, logger: logger}
}

// Run keeps a healthy LISTEN connection until ctx ends, recreating it when
// a ping goes unanswered.
func (l *listener) Run(ctx context.Context) error {
	for {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.logger.Warn("listener lost; recreating it, sweeps cover the gap", "err", err)
		l.wake.all()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(listenerRetryPause):
		}
	}
}

// listen runs one pq.Listener until ctx ends or it fails a ping.
func (l *listener) listen(ctx context.Context) error {
	pl := pq.NewDialListener(keepAliveDialer{}, l.dsn, 100*time.Millisecond, 10*time.Second,
		func(ev pq.ListenerEventType, err error) {
			if err != nil {
				l.logger.Warn("listener connection event", "event", ev.String(), "err", err)
			}
		})
	// Close on every exit path; it also unblocks a Listen that waits for a
	// connection that cannot be made.
	defer pl.Close()

	listened := make(chan error, 1)
	go func() {
		listened <- errors.Join(pl.Listen(eventsChannel), pl.Listen(jobsChannel))
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-listened:
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	l.logger.Debug("listening", "channels", []string{eventsChannel, jobsChannel})
	// Anything recorded before LISTEN took effect sent its notification to
	// nobody.
	l.wake.all()

	ping := time.NewTicker(listenerPingInterval)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case n := <-pl.Notify:
			switch {
			case n == nil: // pq reconnected: notifications in between are lost
				l.wake.all()
			case n.Channel == eventsChannel:
				poke(l.wake.events)
			case n.Channel == jobsChannel:
				poke(l.wake.jobs)
			}
		case <-ping.C:
			if err := pingWithin(pl, listenerPingTimeout); err != nil {
				return fmt.Errorf("listener ping: %w", err)
			}
		}
	}
}

// pingWithin is pl.Ping with a deadline: Ping itself waits for an answer
// forever, which is exactly what a half-open connection never sends.
func pingWithin(pl *pq.Listener, timeout time.Duration) error {
	done := make(chan error, 1) // buffered: the goroutine ends after Close
	go func() { done <- pl.Ping() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("no answer within %s", timeout)
	}
}

// keepAliveDialer dials the LISTEN connection with TCP keep-alives tuned to
// notice a dead peer in under a minute rather than the kernel's two hours.
type keepAliveDialer struct{}

func (keepAliveDialer) dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: timeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     15 * time.Second,
			Interval: 5 * time.Second,
			Count:    3,
		},
	}
}

func (d keepAliveDialer) Dial(network, address string) (net.Conn, error) {
	return d.dialer(10*time.Second).Dial(network, address)
}

func (d keepAliveDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	return d.dialer(timeout).Dial(network, address)
}
