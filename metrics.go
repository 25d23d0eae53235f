// metrics.go: GET /metrics, the overview and the loops' counters in the
// Prometheus text exposition format (version 0.0.4), written by hand.

package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// promWriter writes the exposition format; the first write error sticks.
type promWriter struct {
	w   *bufio.Writer
	err error
}

func (p *promWriter) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

// family writes a metric family's HELP and TYPE lines.
func (p *promWriter) family(name, typ, help string) {
	p.printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (p *promWriter) sample(name, labels string, v float64) {
	if labels != "" {
		labels = "{" + labels + "}"
	}
	p.printf("%s%s %s\n", name, labels, formatFloat(v))
}

// histogram writes one histogram's _bucket, _sum and _count lines.
func (p *promWriter) histogram(name, labels string, h *histogram) {
	sep := ""
	if labels != "" {
		sep = ","
	}
	var cumulative uint64
	for i, b := range h.bounds {
		cumulative += h.counts[i].Load()
		p.sample(name+"_bucket", labels+sep+`le="`+formatFloat(b)+`"`, float64(cumulative))
	}
	p.sample(name+"_bucket", labels+sep+`le="+Inf"`, float64(h.count.Load()))
	p.sample(name+"_sum", labels, math.Float64frombits(h.sumBits.Load()))
	p.sample(name+"_count", labels, float64(h.count.Load()))
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// labelValue escapes a label value as the format requires.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// writeMetrics writes the overview's gauges and the process's counters.
func writeMetrics(w io.Writer, o Overview, c *processCounters) error {
	p := &promWriter{w: bufio.NewWriter(w)}
	p.family("outboxd_events_backlog", "gauge", "Un-fanned, un-poisoned events waiting for the relay.")
	p.sample("outboxd_events_backlog", "", float64(o.Backlog))
	p.family("outboxd_events_poisoned", "gauge", "Events set aside after repeated relay failures.")
	p.sample("outboxd_events_poisoned", "", float64(o.Poisoned))
	p.family("outboxd_events_oldest_unfanned_age_seconds", "gauge", "Age of the oldest event waiting for the relay.")
	p.sample("outboxd_events_oldest_unfanned_age_seconds", "", o.OldestUnfannedAgeSeconds)
	p.family("outboxd_jobs", "gauge", "Jobs by state.")
	for _, s := range []struct {
		state string
		n     int64
	}{
		{"available", o.Jobs.Available}, {"running", o.Jobs.Running}, {"retryable", o.Jobs.Retryable},
		{"completed", o.Jobs.Completed}, {"discarded", o.Jobs.Discarded},
	} {
		p.sample("outboxd_jobs", `state="`+s.state+`"`, float64(s.n))
	}
	p.family("outboxd_endpoints", "gauge", "Endpoints by state.")
	p.sample("outboxd_endpoints", `state="enabled"`, float64(o.Endpoints.Enabled))
	p.sample("outboxd_endpoints", `state="failing"`, float64(o.Endpoints.Failing))
	p.sample("outboxd_endpoints", `state="disabled"`, float64(o.Endpoints.Disabled))
	p.family("outboxd_table_bytes", "gauge", "Total size of outboxd's tables, indexes and TOAST included.")
	for _, t := range o.Tables {
		p.sample("outboxd_table_bytes", `table="`+labelValue(t.Name)+`"`, float64(t.TotalBytes))
	}
	p.family("outboxd_table_dead_rows", "gauge", "Dead rows waiting for vacuum, by table.")
	for _, t := range o.Tables {
		p.sample("outboxd_table_dead_rows", `table="`+labelValue(t.Name)+`"`, float64(t.DeadRows))
	}
	p.family("outboxd_oldest_transaction_age_seconds", "gauge", "Age of the oldest open transaction holding back vacuum in this database.")
	p.sample("outboxd_oldest_transaction_age_seconds", "", o.OldestXactAgeSeconds)
	p.family("outboxd_notify_queue_usage_ratio", "gauge", "Share of PostgreSQL's NOTIFY queue in use; full, it fails every notifying COMMIT.")
	p.sample("outboxd_notify_queue_usage_ratio", "", o.NotifyQueueUsage)
	p.family("outboxd_alerts_firing", "gauge", "Alerts firing, by name.")
	for _, name := range alertNames {
		firing := 0.0
		for _, a := range o.Alerts {
			if a.Name == name {
				firing = 1
			}
		}
		p.sample("outboxd_alerts_firing", `alert="`+name+`"`, firing)
	}

	if c != nil {
		c.write(p)
	}
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}

// alertNames lists every alert, so /metrics shows the cleared ones as 0.
var alertNames = []string{"events_backlog", "events_poisoned", "jobs_discarded", "endpoint_disabled", "endpoint_paused", "notify_queue",
	"table_bloat", "old_transaction", "retention_failed", "receiver_window_short"}

// processCounters are what this process's loops did since it started; each
// replica reports its own, and Prometheus sums them.
type processCounters struct {
	relay      *relay
	workers    *workerPool
	rescuer    *rescuer
	deliveries *deliveryMetrics
	notifier   *ownerNotifier
	retention  *sweeper // its cycles, anomaly-cap stops and rows pruned; nil without one
	registry   *replicaRegistry
}

func (c *processCounters) write(p *promWriter) {
	if c.relay != nil {
		p.family("outboxd_relay_passes_total", "counter", "Relay passes run.")
		p.sample("outboxd_relay_passes_total", "", float64(c.relay.passes.Load()))
		p.family("outboxd_relay_pass_seconds", "histogram", "Duration of one relay pass's statement, its claim for this process's workers included (outboxd_relay_jobs_claimed_total).")
		p.histogram("outboxd_relay_pass_seconds", "", c.relay.passTime)
		p.family("outboxd_relay_events_total", "counter", "Events fanned out by the relay.")
		p.sample("outboxd_relay_events_total", "", float64(c.relay.eventsFanned.Load()))
		p.family("outboxd_relay_jobs_enqueued_total", "counter", "Jobs enqueued by the relay.")
		p.sample("outboxd_relay_jobs_enqueued_total", "", float64(c.relay.jobsEnqueued.Load()))
		p.family("outboxd_relay_row_failures_total", "counter", "Failed relay attempts counted against single events.")
		p.sample("outboxd_relay_row_failures_total", "", float64(c.relay.rowFailures.Load()))
		p.family("outboxd_relay_jobs_claimed_total", "counter", "Jobs claimed by relay passes that keep up, for this process's workers (outbox.fan_out_and_claim).")
		p.sample("outboxd_relay_jobs_claimed_total", "", float64(c.relay.jobsClaimed.Load()))
	}
	if c.workers != nil {
		p.family("outboxd_job_attempts_total", "counter", "Job attempts by outcome.")
		p.sample("outboxd_job_attempts_total", `outcome="completed"`, float64(c.workers.completed.Load()))
		p.sample("outboxd_job_attempts_total", `outcome="retryable"`, float64(c.workers.retried.Load()))
		p.sample("outboxd_job_attempts_total", `outcome="discarded"`, float64(c.workers.discarded.Load()))
		p.family("outboxd_job_claim_seconds", "histogram", "Duration of one claim statement (outbox.claim_jobs).")
		p.histogram("outboxd_job_claim_seconds", "", c.workers.claims)
		p.family("outboxd_jobs_claimed_total", "counter", "Jobs taken by the workers' own claims (outboxd_job_claim_seconds); the relay's are outboxd_relay_jobs_claimed_total.")
		p.sample("outboxd_jobs_claimed_total", "", float64(c.workers.claimedJobs.Load()))
		p.family("outboxd_job_outcome_batch_seconds", "histogram", "Duration of writing one batch of job outcomes, retries included.")
		p.histogram("outboxd_job_outcome_batch_seconds", "", c.workers.outcomeBatches)
		p.family("outboxd_job_outcomes_written_total", "counter", "Job outcomes in the batches written.")
		p.sample("outboxd_job_outcomes_written_total", "", float64(c.workers.outcomeJobs.Load()))
	}
	if c.rescuer != nil {
		p.family("outboxd_jobs_rescued_total", "counter", "Jobs found running past the rescue horizon.")
		p.sample("outboxd_jobs_rescued_total", "", float64(c.rescuer.rescued.Load()))
		p.family("outboxd_jobs_rescued_from_dead_replicas_total", "counter", "Running jobs of replicas declared dead (no heartbeat), rescued by this process.")
		p.sample("outboxd_jobs_rescued_from_dead_replicas_total", "", float64(c.rescuer.rescuedOfDead.Load()))
		p.family("outboxd_replicas_declared_dead_total", "counter", "Replicas this process declared dead: no heartbeat within their dead_after.")
		p.sample("outboxd_replicas_declared_dead_total", "", float64(c.rescuer.declaredDead.Load()))
	}
	if c.registry != nil {
		p.family("outboxd_replica_reregistered_total", "counter", "Times this process found itself declared dead and registered again under a new id.")
		p.sample("outboxd_replica_reregistered_total", "", float64(c.registry.reregistered.Load()))
	}
	if d := c.deliveries; d != nil {
		p.family("outboxd_deliveries_total", "counter", "Webhook delivery attempts by outcome.")
		outcomes := d.outcomes.Snapshot()
		for _, o := range sortedKeys(outcomes) {
			p.sample("outboxd_deliveries_total", `outcome="`+labelValue(o)+`"`, float64(outcomes[o]))
		}
		p.family("outboxd_delivery_duration_seconds", "histogram", "Duration of one webhook delivery attempt.")
		p.histogram("outboxd_delivery_duration_seconds", "", d.latency)
		p.family("outboxd_commit_to_first_2xx_seconds", "histogram", "Time from an event's commit to its first 2xx answer, by endpoint.")
		for _, ep := range d.commitTo2xx.labels() {
			p.histogram("outboxd_commit_to_first_2xx_seconds", `endpoint="`+labelValue(ep)+`"`, d.commitTo2xx.With(ep))
		}
	}
	if n := c.notifier; n != nil {
		p.family("outboxd_owner_notifications_sent_total", "counter", "Mails sent to endpoint owners about failing or disabled endpoints.")
		p.sample("outboxd_owner_notifications_sent_total", "", float64(n.sent.Load()))
		p.family("outboxd_owner_notifications_dropped_total", "counter", "Owner notifications deliberately not sent: over the hourly cap per owner.")
		p.sample("outboxd_owner_notifications_dropped_total", "", float64(n.dropped.Load()))
	}
	if s := c.retention; s != nil {
		p.family("outboxd_retention_cycles_total", "counter", "Retention cycles by result: swept by this process, skipped while another replica held the lock, or failed (an anomaly-cap stop included).")
		p.sample("outboxd_retention_cycles_total", `result="swept"`, float64(s.cycles.Load()))
		p.sample("outboxd_retention_cycles_total", `result="skipped"`, float64(s.skipped.Load()))
		p.sample("outboxd_retention_cycles_total", `result="failed"`, float64(s.failed.Load()))
		p.family("outboxd_retention_anomaly_cap_stops_total", "counter", "Cycles a sweep stopped at -retention-anomaly-cap instead of deleting on.")
		for _, st := range s.Stats() {
			p.sample("outboxd_retention_anomaly_cap_stops_total", `sweep="`+labelValue(st.Sweep)+`"`, float64(st.CapHits))
		}
		p.family("outboxd_rows_pruned_total", "counter", "Rows deleted by the retention sweeps, by table.")
		pruned := s.PrunedByTable()
		for _, table := range sortedKeys(pruned) {
			p.sample("outboxd_rows_pruned_total", `table="`+labelValue(table)+`"`, float64(pruned[table]))
		}
	}
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writeDeliveryStatsMetrics writes every endpoint's delivery statistics
// over the last hour (stats.go, outbox.delivery_stats): gauges, not
// counters, as retention deletes old minutes, and the same on every
// replica, which reads them from the database (aggregate them with max,
// not sum). The histogram above counts this process's deliveries since it
// started; these count every replica's, and survive restarts.
func writeDeliveryStatsMetrics(w io.Writer, st DeliveryStats) error {
	p := &promWriter{w: bufio.NewWriter(w)}
	p.family("outboxd_delivery_stats_last_hour_produced", "gauge", "Deliveries fanned out in the last 60 minutes, the current one included; every replica's.")
	p.sample("outboxd_delivery_stats_last_hour_produced", "", float64(st.Produced))
	p.family("outboxd_delivery_stats_last_hour_attempts", "gauge", "Delivery attempts in the last 60 minutes, the current one included, by outcome; every replica's.")
	c := st.FailuresByClass
	for _, o := range []struct {
		outcome string
		n       int64
	}{
		{"success", st.Successes}, {"timeout", c.Timeout}, {"4xx", c.Status4xx}, {"5xx", c.Status5xx},
		{"connection", c.Connection}, {"other", c.Other},
	} {
		p.sample("outboxd_delivery_stats_last_hour_attempts", `outcome="`+o.outcome+`"`, float64(o.n))
	}
	p.family("outboxd_delivery_stats_last_hour_commit_to_first_2xx_seconds", "gauge",
		"Commit to first 2xx over the last 60 minutes: the upper bound of the bucket holding the quantile; absent without a success.")
	for _, q := range []struct {
		label string
		ms    *float64
	}{{"0.5", st.LatencyP50MS}, {"0.99", st.LatencyP99MS}} {
		if q.ms != nil {
			p.sample("outboxd_delivery_stats_last_hour_commit_to_first_2xx_seconds", `quantile="`+q.label+`"`, *q.ms/1000)
		}
	}
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}
