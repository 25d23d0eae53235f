// fuzz_test.go: fuzz targets for the pure functions at outboxd's edges: the
// webhook body encoder, the topic-pattern matcher and configuration
// parsing (FuzzVerifyWebhook lives in signature_test.go). Their seed corpora
// run in every `go test`; `go test -fuzz FuzzX` explores further.

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// The body is valid JSON with the event's fields, its data is the payload
// compacted byte for byte (no HTML escaping), it is the same on every call,
// and a payload that is not JSON is an error, never a panic or a broken body.
func FuzzEncodeWebhookBody(f *testing.F) {
	f.Add(int64(42), "order.paid", "o-7", `{"note": "<b>&", "cents": 1200}`, int64(1767225600123456000))
	f.Add(int64(1), "t", "", ``, int64(0))
	f.Add(int64(-1), "a/b:c-d_e", "\xff\xfe", `[1, 2, {"x": null}]`, int64(-62135596800000000000/1000))
	f.Add(int64(9223372036854775807), "t", "\u2028", `"\u2028 <script>"`, int64(253402300799999999999/1000))
	f.Add(int64(7), "t", "s", `{"a": `, int64(1))
	f.Add(int64(7), "t", "s", `{"a": 1} {"b": 2}`, int64(1))
	f.Add(int64(7), "t", "s", "  \n\t{\"deep\": [[[[[]]]]]}  ", int64(1))
	f.Fuzz(func(t *testing.T, id int64, topic, subject, payload string, unixNano int64) {
		ev := Event{ID: id, Topic: topic, Subject: subject, Payload: json.RawMessage(payload), CreatedAt: time.Unix(0, unixNano)}
		body, err := encodeWebhookBody(ev)
		if payload != "" && !json.Valid([]byte(payload)) {
			if err == nil {
				t.Fatalf("payload %q is not JSON, and the body %q was made anyway", payload, body)
			}
			return
		}
		if err != nil {
			t.Fatalf("payload %q: %v", payload, err)
		}
		again, _ := encodeWebhookBody(ev)
		if !bytes.Equal(body, again) {
			t.Fatalf("two encodings differ:\n%s\n%s", body, again)
		}
		if !json.Valid(body) || bytes.HasSuffix(body, []byte("\n")) {
			t.Fatalf("body %q is not one JSON value without a trailing newline", body)
		}
		var got struct {
			ID        string          `json:"id"`
			Type      string          `json:"type"`
			Subject   string          `json:"subject"`
			Timestamp string          `json:"timestamp"`
			Data      json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		want := []string{strconv.FormatInt(id, 10), perByteReplaced(topic), perByteReplaced(subject)}
		if diff := cmp.Diff(want, []string{got.ID, got.Type, got.Subject}); diff != "" {
			t.Errorf("id, type, subject (-want +got):\n%s", diff)
		}
		wantData := []byte("{}")
		if payload != "" {
			var buf bytes.Buffer
			json.Compact(&buf, []byte(payload))
			wantData = buf.Bytes()
		}
		if !bytes.Equal(wantData, got.Data) {
			t.Errorf("data = %s, want the payload compacted: %s", got.Data, wantData)
		}
		if y := ev.CreatedAt.UTC().Year(); y >= 0 && y <= 9999 {
			ts, err := time.Parse(time.RFC3339Nano, got.Timestamp)
			if err != nil || !ts.Equal(ev.CreatedAt) {
				t.Errorf("timestamp %q = %v, %v; want %v", got.Timestamp, ts, err, ev.CreatedAt)
			}
		}
	})
}

// checkJSONBody refuses a body's text exactly where encoding/json would
// silently put U+FFFD: for any JSON value v without a U+FFFD of its own,
// checkJSONBody on {"v": v} calls it not text iff decoding it yields a
// U+FFFD in a string or a name; and it does not panic on any JSON.
func FuzzCheckJSONBody(f *testing.F) {
	for _, seed := range []string{`"plain"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"\ud800"`, `"\udc00"`,
		`"\ud800\u0041"`, `"\ud800\ud800"`, `"\udbff\udfff"`, `"a\ud800"`, `["\ud800", 1]`, `{"\ud800": 1}`,
		`"\\ud800"`, `"\\\ud800"`, "\"\xff\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "\"Köln 東京 🚀\"",
		`{"a": {"b": [{"c": "\ud800"}]}}`, `"\u00e9\t\"\/"`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		body := []byte(`{"v": ` + v + `}`)
		if !json.Valid(body) {
			return
		}
		err := checkJSONBody(body, map[string]bool{"v": true})
		lower := strings.ToLower(v)
		if strings.Contains(lower, `\ufffd`) || strings.ContainsRune(v, utf8.RuneError) || strings.Contains(fmt.Sprint(err), "given twice") {
			return // U+FFFD sent, or refused before the text was read
		}
		var decoded any
		if err := json.Unmarshal(body, &decoded); err != nil {
			t.Fatal(err)
		}
		replaced := holdsReplacement(decoded)
		refused := err != nil && (strings.Contains(err.Error(), "is not UTF-8 text") || strings.Contains(err.Error(), "lone UTF-16 surrogate"))
		if replaced != refused || (err != nil && !refused) {
			t.Errorf("%q: encoding/json replaces text %v, checkJSONBody: %v", v, replaced, err)
		}
	})
}

// holdsReplacement reports whether a decoded JSON value holds U+FFFD in a
// string or a name.
func holdsReplacement(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, utf8.RuneError)
	case []any:
		return slices.ContainsFunc(v, holdsReplacement)
	case map[string]any:
		for name, member := range v {
			if holdsReplacement(name) || holdsReplacement(member) {
				return true
			}
		}
	}
	return false
}

// perByteReplaced is s with each byte of invalid UTF-8 replaced by U+FFFD,
// as encoding/json writes it.
func perByteReplaced(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}

// topicSeeds are the matcher's seed corpus: patterns and topics near every
// rule's edge. The fuzz target starts from them, and
// TestTopicMatchesAgreesWithSQL runs every pair through the database.
var topicSeeds = struct{ patterns, topics []string }{
	patterns: []string{"*", "order.*", "order.paid", "order", "order..*", "o.*", "a/b:c.*",
		".*", "order.*.paid", "*.paid", "order*", "", " order.paid", "Order.*", "order.**", "_.*", "order.paid.*"},
	topics: []string{"order.paid", "order", "order.", "order..x", "orders.paid", "order.paid.late", "o.x",
		"a/b:c.d", "Order.paid", "_.x", "paid", "order.*", "x"},
}

// topicMatchesSpec is the rule as docs/recording.md states it, written apart from
// topicMatches: an empty list or "*" selects all; "p.*" selects the topics
// that start with "p."; anything else must be equal.
func topicMatchesSpec(patterns []string, topic string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if p == "*" || p == topic {
			return true
		}
		if len(p) >= 2 && p[len(p)-2:] == ".*" && len(topic) >= len(p)-1 && topic[:len(p)-1] == p[:len(p)-1] {
			return true
		}
	}
	return false
}

// For every valid pattern and topic, topicMatches follows the stated rule;
// for any input at all it does not panic.
func FuzzTopicMatches(f *testing.F) {
	for _, p := range topicSeeds.patterns {
		for _, topic := range topicSeeds.topics {
			f.Add(p, topic)
		}
	}
	f.Fuzz(func(t *testing.T, pattern, topic string) {
		got := topicMatches([]string{pattern}, topic)
		if !topicMatches(nil, topic) {
			t.Fatalf("no patterns must select %q", topic)
		}
		if topicPatternValid(pattern) != nil || !topicPattern.MatchString(topic) {
			return
		}
		if want := topicMatchesSpec([]string{pattern}, topic); got != want {
			t.Errorf("topicMatches(%q, %q) = %t, want %t", pattern, topic, got, want)
		}
		if got && pattern != "*" && strings.ContainsRune(topic, '*') {
			t.Errorf("topic %q with a star is valid", topic)
		}
		if !utf8.ValidString(pattern) {
			t.Errorf("invalid UTF-8 pattern %q passed topicPatternValid", pattern)
		}
	})
}

// outbox.topic_matches, which the fan-out evaluates, its two halves
// outbox.topic_split and outbox.topic_selected, which a replay's walk
// evaluates, and topicMatches, which the panel and the tests use, agree on
// the whole seed corpus and outboxd's own topics: every valid pattern,
// alone, paired and as an empty list, against every valid topic.
func TestTopicMatchesAgreesWithSQL(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var patterns, topics []string
	for _, p := range append(topicSeeds.patterns, "outboxd.*", "outboxd.endpoint.*", "outboxd.endpoint.failing") {
		if topicPatternValid(p) == nil {
			patterns = append(patterns, p)
		}
	}
	for _, topic := range append(topicSeeds.topics, "outboxd.endpoint.failing", "outboxd.x", "outboxd") {
		if topicPattern.MatchString(topic) {
			topics = append(topics, topic)
		}
	}
	lists := [][]string{{}}
	for i, p := range patterns {
		lists = append(lists, []string{p})
		lists = append(lists, []string{p, patterns[(i+1)%len(patterns)]})
	}
	for _, list := range lists {
		rows, err := db.Query(`
			SELECT t, outbox.topic_matches($1::text[], t), outbox.topic_selected(t, s.names, s.prefixes, s.every_topic)
			FROM unnest($2::text[]) AS t, outbox.topic_split($1::text[]) AS s`, pq.Array(list), pq.Array(topics))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var topic string
			var inSQL, split bool
			if err := rows.Scan(&topic, &inSQL, &split); err != nil {
				t.Fatal(err)
			}
			if inGo := topicMatches(list, topic); inGo != inSQL || inGo != split {
				t.Errorf("patterns %q, topic %q: Go says %t, topic_matches %t, topic_split and topic_selected %t", list, topic, inGo, inSQL, split)
			}
		}
		rows.Close()
	}
}

// configArgs renders cfg as flags that parseConfig reads back to cfg: one
// -name=value per flag, so no value is mistaken for a flag.
func configArgs(cfg Config) []string {
	var args []string
	args = append(args, strings.Fields(cfg.Command)...) // "secrets encrypt" is two words
	flag := func(name string, v any) { args = append(args, fmt.Sprintf("-%s=%v", name, v)) }
	flag("database-url", cfg.DatabaseURL)
	flag("data-dir", cfg.DataDir)
	flag("addr", cfg.Addr)
	flag("admin-token", cfg.AdminToken)
	flag("log-format", cfg.LogFormat)
	flag("log-level", cfg.LogLevel.String())
	flag("allow-private-endpoints", cfg.AllowPrivateEndpoints)
	flag("demo", cfg.Demo)
	flag("disable-listen", cfg.DisableListen)
	flag("pool-mode", cfg.PoolMode)
	flag("migrate", cfg.Migrate)
	flag("print-sql", cfg.PrintSQL)
	flag("from-release", cfg.FromRelease)
	flag("relay-batch", cfg.Relay.BatchSize)
	flag("relay-max-failures", cfg.Relay.MaxFailures)
	flag("relay-sweep", cfg.Relay.SweepInterval)
	flag("relay-pass-timeout", cfg.Relay.PassTimeout)
	flag("failing-endpoint-delay", cfg.Relay.FailingEndpointDelay)
	flag("workers", cfg.Workers.Concurrency)
	flag("job-max-attempts", cfg.Workers.MaxAttempts)
	flag("breaker-threshold", cfg.Workers.BreakerThreshold)
	flag("job-timeout", cfg.Workers.AttemptTimeout)
	flag("job-rescue-margin", cfg.Workers.RescueMargin)
	flag("job-poll", cfg.Workers.PollInterval)
	flag("job-rescue-interval", cfg.Workers.RescueInterval)
	flag("replica-heartbeat", cfg.Replicas.Heartbeat)
	flag("replica-dead-after", cfg.Replicas.DeadAfter)
	flag("alert-backlog", cfg.Alerts.BacklogRows)
	flag("alert-backlog-age", cfg.Alerts.BacklogAge)
	flag("alert-dead-ratio", cfg.Alerts.DeadRatio)
	flag("alert-xact-age", cfg.Alerts.XactAge)
	flag("alert-endpoint-success-below", cfg.Alerts.EndpointSuccessBelow)
	flag("alert-endpoint-failing-for", cfg.Alerts.EndpointFailingFor)
	flag("alert-client-cert-expiry", cfg.Alerts.ClientCertExpiry)
	flag("metrics-public", cfg.MetricsPublic)
	flag("webhook-timeout", cfg.Webhooks.Timeout)
	flag("webhook-secret-rotation-window", cfg.Webhooks.SecretRotationWindow)
	flag("events-retention", cfg.Retention.Events)
	flag("inbox-retention", cfg.Retention.Inbox)
	flag("completed-jobs-retention", cfg.Retention.CompletedJobs)
	flag("discarded-jobs-retention", cfg.Retention.DiscardedJobs)
	flag("delivery-stats-retention", cfg.Retention.DeliveryStats)
	flag("retention-interval", cfg.Retention.Interval)
	flag("retention-batch", cfg.Retention.BatchSize)
	flag("endpoint-disable-after", cfg.Retention.EndpointDisableAfter)
	flag("retention-anomaly-cap", cfg.Retention.AnomalyCap)
	flag("smtp-url", cfg.Mail.SMTPURL)
	flag("smtp-from", cfg.Mail.From)
	flag("smtp-message-id-host", cfg.Mail.MessageIDHost)
	flag("owner-notify-per-hour", cfg.Mail.OwnerNotifyPerHour)
	flag("db-max-conns", cfg.DBMaxConns)
	flag("database-wait", cfg.DatabaseWait)
	flag("shutdown-grace", cfg.ShutdownGrace)
	flag("secrets-key", cfg.SecretsKey)
	flag("secrets-old-key", cfg.SecretsOldKey)
	flag("tls-cert", cfg.TLSCert)
	flag("tls-key", cfg.TLSKey)
	flag("insecure-http", cfg.InsecureHTTP)
	flag("public-url", cfg.PublicURL)
	flag("trusted-proxies", cfg.TrustedProxies.String())
	flag("audit-retention", cfg.Retention.Audit)
	flag("signin-link-lifetime", cfg.SigninLinkLifetime)
	flag("egress-proxy", cfg.EgressProxy)
	return args
}

// configArgs names every flag parseConfig defines, so the round trip in
// FuzzParseConfig covers every setting; a new flag fails here until added.
func TestConfigArgsCoversEveryFlag(t *testing.T) {
	t.Parallel()
	var usage strings.Builder
	parseConfig([]string{"-help"}, envFrom(nil), &usage)
	var defined, rendered []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)  \(`).FindAllStringSubmatch(usage.String(), -1) {
		defined = append(defined, m[1])
	}
	for _, a := range configArgs(defaultConfig()) {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		rendered = append(rendered, name)
	}
	slices.Sort(defined)
	slices.Sort(rendered)
	if diff := cmp.Diff(defined, rendered); diff != "" || len(defined) == 0 {
		t.Errorf("flags defined (-) and rendered by configArgs (+):\n%s", diff)
	}
}

// parseConfig never panics, whatever the flags and environment; and a
// configuration it accepts, rendered back into flags, parses to itself.
func FuzzParseConfig(f *testing.F) {
	f.Add("", "")
	f.Add("-relay-batch\n50", "DATABASE_URL=postgres://u@db.example:5432/app\nOUTBOXD_RELAY_BATCH=70")
	f.Add("migrate\n-addr\n0.0.0.0:9000", "OUTBOXD_JOB_TIMEOUT=10s\nOUTBOXD_ALLOW_PRIVATE_ENDPOINTS=1")
	f.Add("-log-level=debug+2\n-log-format=json", "OUTBOXD_ADMIN_TOKEN=-starts-with-a-dash-0123")
	f.Add("-relay-sweep=1h0m0.000000001s", "OUTBOXD_WEBHOOK_TIMEOUT=10m")
	f.Add("-admin-token\n-x", "")
	f.Add("load\n-x", "")
	f.Add("-job-max-attempts=100", "")
	f.Add("", "OUTBOXD_LOG_LEVEL=WARN-3\nOUTBOXD_DEMO=true\nOUTBOXD_DATA_DIR=")
	f.Add("-database-url=host=/tmp port=5432 dbname=x", "")
	f.Add("-public-url=https://outboxd.example.com", "OUTBOXD_TRUSTED_PROXIES=10.0.0.1/8, 192.168.1.7,::ffff:10.1.0.0/112")
	f.Add("secrets\nrotate-key\n-secrets-key=AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=", "OUTBOXD_SECRETS_OLD_KEY=AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=")
	f.Fuzz(func(t *testing.T, argText, envText string) {
		var args []string
		if argText != "" {
			args = strings.Split(argText, "\n")
		}
		env := map[string]string{}
		for line := range strings.SplitSeq(envText, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				env[k] = v
			}
		}
		cfg, err := parseConfig(args, envFrom(env), io.Discard)
		if err != nil {
			return
		}
		again, err := parseConfig(configArgs(cfg), envFrom(nil), io.Discard)
		if err != nil {
			t.Fatalf("accepted %q with %v, but its rendering %q is refused: %v", args, env, configArgs(cfg), err)
		}
		if diff := cmp.Diff(cfg, again, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
			t.Errorf("re-parsed configuration differs (-first +again):\n%s", diff)
		}
	})
}

// topicMatches is outbox.topic_matches in Go, the oracle the fuzz tests hold the SQL and the stated rule against.
func topicMatches(patterns []string, topic string) bool {
	if strings.HasPrefix(topic, internalTopicPrefix) {
		var named []string
		for _, p := range patterns {
			if strings.HasPrefix(p, internalTopicPrefix) {
				named = append(named, p)
			}
		}
		if len(named) == 0 {
			return false
		}
		patterns = named
	}
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if p == topic || p == "*" {
			return true
		}
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasSuffix(prefix, ".") && strings.HasPrefix(topic, prefix) {
			return true
		}
	}
	return false
}
