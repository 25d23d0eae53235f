// river.go: River's side: its tables, the two job kinds, bulk insertion,
// and `riverbench work`, the child process that runs a River client.

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// openPool opens a pgx pool; maxConns 0 keeps pgxpool's default (the
// larger of 4 and the CPU count), which is what `river bench` runs with.
func openPool(ctx context.Context, url string, maxConns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if maxConns > 0 {
		pc.MaxConns = int32(maxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// prepareRiver applies River's migrations and empties its job table, as
// `river bench` does before it inserts (it also runs VACUUM FULL, which on
// the fresh database compare makes changes nothing).
func prepareRiver(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
		return fmt.Errorf("empty river_job: %w", err)
	}
	return nil
}

// noopArgs is `river bench`'s job: a number, and nothing to do.
type noopArgs struct {
	Num int `json:"num"`
}

func (noopArgs) Kind() string { return "noop" }

// webhookArgs is one delivery of one event to the one endpoint. The event
// travels in the job (River has no event table to join), which spares
// River the read outboxd's claim makes of the event row.
type webhookArgs struct {
	EventID string          `json:"event_id"`
	Topic   string          `json:"topic"`
	Subject string          `json:"subject"`
	Data    json.RawMessage `json:"data"`
}

func (webhookArgs) Kind() string { return "webhook" }

// loadPayload is the payload bench/load records with every event.
var loadPayload = json.RawMessage(`{"load":true}`)

// insertBatch is `river bench`'s insert batch: InsertMany of 5,000 jobs a
// transaction.
const insertBatch = 5_000

// insertBulk inserts n jobs, args(i) for i in [0, n), through an
// insert-only client's InsertMany, as `river bench --num-total-jobs` does.
func insertBulk(ctx context.Context, pool *pgxpool.Pool, n int, args func(i int) river.JobArgs) error {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger(io.Discard)})
	if err != nil {
		return fmt.Errorf("insert client: %w", err)
	}
	params := make([]river.InsertManyParams, 0, insertBatch)
	for done := 0; done < n; done += insertBatch {
		params = params[:0]
		for i := done; i < min(done+insertBatch, n); i++ {
			params = append(params, river.InsertManyParams{Args: args(i)})
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return fmt.Errorf("insert jobs: %w", err)
		}
	}
	return nil
}

func quietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// secretEnv carries the endpoint's secret to the child, out of its
// command line.
const secretEnv = "RIVERBENCH_WEBHOOK_SECRET"

// runWork is the child: a River client working the default queue until
// the parent sends SIGTERM. It prints "ready" once the client has started,
// and with -kind noop, once -events jobs have completed, the figure `river
// bench` reports (client start to the last completion it was told of).
func runWork(ctx context.Context, cfg loadConfig, getenv func(string) string, stdout, stderr io.Writer) error {
	pool, err := openPool(ctx, cfg.DatabaseURL, cfg.MaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()

	workers := river.NewWorkers()
	switch cfg.Kind {
	case "noop":
		river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[noopArgs]) error { return nil }))
	case "webhook":
		secret, err := parseSecret(getenv(secretEnv))
		if err != nil {
			return err
		}
		river.AddWorker(workers, &webhookWorker{client: senderClient(cfg.Workers), url: cfg.URL, secret: secret})
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     cfg.FetchCooldown,
		FetchPollInterval: cfg.FetchPollInterval,
		Logger:            quietLogger(stderr),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.Workers}},
		Workers:           workers,
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	// The burn-down counts as `river bench` does: completions through a
	// subscription large enough that none is dropped (it sizes it
	// 75,000). The webhook sender has none: a subscription keeps every
	// event it buffers, which would count against the sender's memory.
	var events <-chan *river.Event
	if cfg.Kind == "noop" {
		var unsubscribe func()
		events, unsubscribe = client.SubscribeConfig(&river.SubscribeConfig{ChanSize: 75_000,
			Kinds: []river.EventKind{river.EventKindJobCompleted}})
		defer unsubscribe()
	}

	// Not ctx: a cancelled start context stops River hard, and SIGTERM
	// should reach Stop below instead.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("start river client: %w", err)
	}
	// river bench starts its clock once Start has returned.
	start := time.Now()
	fmt.Fprintln(stdout, "ready")
	if cfg.Kind == "noop" {
		var last time.Time
		worked := 0
		for worked < cfg.Events && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-events:
				worked++
				last = time.Now()
			}
		}
		if d := last.Sub(start); worked == cfg.Events {
			fmt.Fprintf(stdout, "river client: %d jobs completed %s after client start: %.0f jobs/s (river bench's clock)\n",
				worked, d.Round(time.Millisecond), float64(worked)/d.Seconds())
		} else {
			fmt.Fprintf(stdout, "river client: stopped after %d of %d completions\n", worked, cfg.Events)
		}
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return fmt.Errorf("stop river client: %w", err)
	}
	return nil
}

// parseSecret reads a secret as `whsec_<base64>`, outboxd's form.
func parseSecret(text string) ([]byte, error) {
	rest, ok := strings.CutPrefix(text, "whsec_")
	key, err := base64.StdEncoding.DecodeString(rest)
	if !ok || err != nil || len(key) == 0 {
		return nil, fmt.Errorf("%s: want whsec_ and base64", secretEnv)
	}
	return key, nil
}

// senderClient is an HTTP client tuned for one receiver and workers
// requests at once: an idle connection kept for every worker, so none is
// dialled again. outboxd's is the same apart from its SSRF guard.
func senderClient(workers int) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			ForceAttemptHTTP2:   true,
			MaxIdleConns:        workers,
			MaxIdleConnsPerHost: workers,
			IdleConnTimeout:     30 * time.Second,
		},
		Timeout: 30 * time.Second,
	}
}

// webhookWorker delivers one event to the receiver, signed as outboxd
// signs, and fails the job (River retries it) on anything but a 2xx.
type webhookWorker struct {
	river.WorkerDefaults[webhookArgs]
	client *http.Client
	url    string
	secret []byte
}

// maxResponseRead is outboxd's webhookMaxResponseRead: enough of a small
// answer that the connection is reused.
const maxResponseRead = 64 << 10

func (w *webhookWorker) Work(ctx context.Context, job *river.Job[webhookArgs]) error {
	a := job.Args
	body, err := encodeWebhookBody(a.EventID, a.Topic, a.Subject, job.CreatedAt, a.Data)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	setWebhookHeaders(req.Header, w.secret, a.EventID, time.Now(), body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "riverbench")
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseRead))
	if resp.StatusCode/100 != 2 {
		return errors.New("webhook: answered " + strconv.Itoa(resp.StatusCode))
	}
	return nil
}

// jobsBacklog is what River has not finished.
func jobsBacklog(ctx context.Context, db *pgxpool.Pool) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state IN ('available', 'running', 'retryable', 'scheduled')`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count backlog: %w", err)
	}
	return n, nil
}
