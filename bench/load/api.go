// api.go: outboxd's HTTP API and /metrics as the generator calls them,
// with the JSON shapes it reads (copied from outboxd's endpoints.go and
// replay.go, only the fields used here).

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Bounds and values of an endpoint's delivery settings, as outboxd's
// endpoints.go declares them.
const (
	defaultMaxInFlight = 16
	maxMaxInFlight     = 1000
	minRateLimit       = 0.01
	maxRateLimit       = 10_000
	orderingNone       = "none"
	orderingSubject    = "subject"
	breakerOpen        = "open"
	breakerClosed      = "closed"
	replayFinished     = "finished"
)

// replayShare is how many of an endpoint's deliveries its replay lane
// runs at once while no live ones flow, as outboxd's replay.go has it: a
// quarter of its cap, at least 1.
func replayShare(maxInFlight int) int {
	return max(1, maxInFlight/4)
}

// endpointSettings is what a run registers for a receiver: its topic
// patterns and delivery settings (zero: outboxd's default).
type endpointSettings struct {
	Topics             []string `json:"topics"`
	MaxInFlight        int      `json:"max_in_flight,omitempty"`
	RateLimitPerSecond float64  `json:"rate_limit_per_second,omitempty"`
	Ordering           string   `json:"ordering,omitempty"`
}

// endpoint is an endpoint as GET /api/endpoints/{id} shows it.
type endpoint struct {
	ID          int64  `json:"id"`
	MaxInFlight int    `json:"max_in_flight"`
	Ordering    string `json:"ordering"`
	Breaker     struct {
		State               string     `json:"state"`
		ConsecutiveFailures int        `json:"consecutive_failures"`
		OpenedAt            *time.Time `json:"opened_at"`
	} `json:"breaker"`
}

// replayResult is POST /api/endpoints/{id}/replay's answer.
type replayResult struct {
	Jobs     int64 `json:"jobs"`
	ReplayID int64 `json:"replay_id"`
}

// replayPreview is the answer to a replay's dry run.
type replayPreview struct {
	Events           int64 `json:"events"`
	EstimatedSeconds int64 `json:"estimated_seconds"`
}

// replayView is one replay as GET /api/endpoints/{id}/replays lists it.
type replayView struct {
	ID    int64   `json:"id"`
	State string  `json:"state"`
	Rate  float64 `json:"rate"`
}

// randomToken is a fresh admin token for the children of one run.
func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// call makes one API request to the child, with body as JSON (nil: none),
// and decodes a 2xx answer into out (nil: ignored). Any other status is
// an error carrying the answer's {"error"}.
func (c *child) call(ctx context.Context, method, path string, body, out any) error {
	var in io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		in = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+path, in)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var refusal struct {
			Error string `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&refusal)
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, refusal.Error)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return fmt.Errorf("%s %s: decode the answer: %w", method, path, err)
		}
	}
	return nil
}

// CreateEndpoint registers r through the API, hands it the endpoint's
// secret and returns the endpoint's id.
func (c *child) CreateEndpoint(ctx context.Context, r *receiver, settings endpointSettings) (int64, error) {
	body := struct {
		URL         string `json:"url"`
		Description string `json:"description"`
		endpointSettings
	}{r.url, "bench/load", settings}
	var created struct {
		ID     int64  `json:"id"`
		Secret string `json:"secret"`
	}
	if err := c.call(ctx, "POST", "/api/endpoints", body, &created); err != nil {
		return 0, fmt.Errorf("create endpoint: %w", err)
	}
	secret, err := parseWebhookSecret(created.Secret)
	if err != nil {
		return 0, fmt.Errorf("endpoint secret: %w", err)
	}
	r.secret.Store(&secret)
	return created.ID, nil
}

// Endpoint reads endpoint id.
func (c *child) Endpoint(ctx context.Context, id int64) (endpoint, error) {
	var ep endpoint
	if err := c.call(ctx, "GET", fmt.Sprintf("/api/endpoints/%d", id), nil, &ep); err != nil {
		return ep, fmt.Errorf("get endpoint %d: %w", id, err)
	}
	return ep, nil
}

// DeleteEndpoint deletes endpoint id; its unfinished deliveries end
// discarded.
func (c *child) DeleteEndpoint(ctx context.Context, id int64) error {
	if err := c.call(ctx, "DELETE", fmt.Sprintf("/api/endpoints/%d", id), nil, nil); err != nil {
		return fmt.Errorf("delete endpoint %d: %w", id, err)
	}
	return nil
}

// EndpointAction posts action ("pause", "resume") to endpoint id.
func (c *child) EndpointAction(ctx context.Context, id int64, action string) error {
	if err := c.call(ctx, "POST", fmt.Sprintf("/api/endpoints/%d/%s", id, action), nil, nil); err != nil {
		return fmt.Errorf("%s endpoint %d: %w", action, id, err)
	}
	return nil
}

// PatchEndpoint changes endpoint id's settings.
func (c *child) PatchEndpoint(ctx context.Context, id int64, patch map[string]any) error {
	if err := c.call(ctx, "PATCH", fmt.Sprintf("/api/endpoints/%d", id), patch, nil); err != nil {
		return fmt.Errorf("patch endpoint %d: %w", id, err)
	}
	return nil
}

// Replay posts a replay request (or its dry run) for endpoint id and
// decodes the answer into out.
func (c *child) Replay(ctx context.Context, id int64, req map[string]any, out any) error {
	if err := c.call(ctx, "POST", fmt.Sprintf("/api/endpoints/%d/replay", id), req, out); err != nil {
		return fmt.Errorf("replay to endpoint %d: %w", id, err)
	}
	return nil
}

// ReplayView reads replay replayID of endpoint id.
func (c *child) ReplayView(ctx context.Context, id, replayID int64) (replayView, error) {
	var list struct {
		Replays []replayView `json:"replays"`
	}
	if err := c.call(ctx, "GET", fmt.Sprintf("/api/endpoints/%d/replays", id), nil, &list); err != nil {
		return replayView{}, fmt.Errorf("replays of endpoint %d: %w", id, err)
	}
	for _, v := range list.Replays {
		if v.ID == replayID {
			return v, nil
		}
	}
	return replayView{}, fmt.Errorf("replay %d of endpoint %d not listed", replayID, id)
}

// replaySettleWait bounds how long SettledReplayView waits for the last
// outcomes to be written: the completer's batches, not the network.
const replaySettleWait = 30 * time.Second

// SettledReplayView is the replay as the API shows it once it has
// finished. The receiver accepting every replayed event comes first; the
// replay finishes when outboxd has recorded their outcomes, a moment
// later, so a single read could still find it running. After
// replaySettleWait it is returned as it is.
func (c *child) SettledReplayView(ctx context.Context, id, replayID int64) (replayView, error) {
	deadline := time.Now().Add(replaySettleWait)
	for {
		view, err := c.ReplayView(ctx, id, replayID)
		if err != nil || view.State == replayFinished || time.Now().After(deadline) {
			return view, err
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return view, err
		}
	}
}

// DeliveryAttempts is the child's outboxd_deliveries_total, every outcome
// summed: the webhook requests this process made.
func (c *child) DeliveryAttempts(ctx context.Context) (int64, error) {
	sums, err := c.MetricSums(ctx)
	return int64(sums["outboxd_deliveries_total"]), err
}

// MetricSums reads the child's /metrics: each sample's value by its name
// (a histogram's _count and _sum are names of their own), summed over
// labels. Bucket samples are left out.
func (c *child) MetricSums(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+c.addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read metrics: status %d", resp.StatusCode)
	}
	sums, err := sumMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return sums, nil
}

// sumMetrics reads the Prometheus text format: comments and buckets
// skipped, every other sample added to its name's sum.
func sumMetrics(r io.Reader) (map[string]float64, error) {
	sums := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The value is last (outboxd writes no timestamps); a label's
		// value may hold spaces.
		space := strings.LastIndexByte(line, ' ')
		name, _, _ := strings.Cut(line[:max(space, 0)], "{")
		if space < 0 || strings.HasSuffix(name, "_bucket") {
			continue
		}
		if n, err := strconv.ParseFloat(line[space+1:], 64); err == nil {
			sums[name] += n
		}
	}
	return sums, sc.Err()
}
