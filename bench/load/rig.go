// rig.go: a run's outboxd processes, receivers and endpoints, set up
// through the API and undone in order when the run ends.

package main

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// loadRun is what run hands a mode: the run's database and where to
// print.
type loadRun struct {
	db             *sql.DB
	dsn            string
	stdout, stderr io.Writer
	logger         *slog.Logger
}

// rig is a mode's children, receivers and endpoints. The children share
// the database, the admin token and -serve-flags.
type rig struct {
	loadRun
	bin, token string
	extra      []string
	children   []*child
	receivers  []*receiver
	endpoints  []int64 // to delete when the run ends
}

func newRig(cfg config, run loadRun) *rig {
	return &rig{loadRun: run, bin: cfg.Outboxd, token: randomToken(), extra: strings.Fields(cfg.ServeFlags)}
}

// start has n children (replicas) running, starting those that are not,
// all at once, so that they share the work from its start.
func (g *rig) start(ctx context.Context, n int) error {
	for len(g.children) < n {
		g.children = append(g.children, &child{bin: g.bin, dsn: g.dsn, token: g.token, extra: g.extra, stderr: g.stderr})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range g.children[:n] {
		if !c.Running() {
			wg.Go(func() { errs[i] = c.Start(ctx) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (g *rig) stopChildren() {
	var wg sync.WaitGroup
	for _, c := range g.children {
		wg.Go(c.Stop)
	}
	wg.Wait()
}

// measure has cpu count the running children.
func (g *rig) measure(cpu *cpuMeter) {
	for _, c := range g.children {
		if c.Running() {
			cpu.addProcess(c.cmd.Process.Pid)
		}
	}
}

// receiver starts a receiver that answers as answer says (nil: 204 at
// once) and, with keepSpans, keeps every request's span.
func (g *rig) receiver(answer func(webhookID string) requestAnswer, keepSpans bool) (*receiver, error) {
	r, err := startReceiver(answer, keepSpans)
	if err != nil {
		return nil, err
	}
	g.receivers = append(g.receivers, r)
	return r, nil
}

// endpoint registers r through the first child and returns the endpoint
// as the API shows it.
func (g *rig) endpoint(ctx context.Context, r *receiver, settings endpointSettings) (endpoint, error) {
	id, err := g.children[0].CreateEndpoint(ctx, r, settings)
	if err != nil {
		return endpoint{}, err
	}
	g.endpoints = append(g.endpoints, id)
	return g.children[0].Endpoint(ctx, id)
}

// finish deletes the run's endpoints through a running child, so that no
// later outboxd on this database retries deliveries into the closed
// ports of this run's receivers, then stops the children. Their open
// requests end with them.
func (g *rig) finish(ctx context.Context) {
	var via *child
	for _, c := range g.children {
		if c.Running() {
			via = c
			break
		}
	}
	for _, id := range g.endpoints {
		if via == nil {
			g.logger.Warn("endpoint left in the database: no outboxd runs to delete it", "endpoint_id", id)
			continue
		}
		if err := via.DeleteEndpoint(context.WithoutCancel(ctx), id); err != nil {
			g.logger.Warn("remove the run's endpoint", "endpoint_id", id, "err", err)
		}
	}
	g.endpoints = nil
	g.stopChildren()
}

// Close finishes the run and closes its receivers.
func (g *rig) Close(ctx context.Context) {
	g.finish(ctx)
	for _, r := range g.receivers {
		r.Close()
	}
}
