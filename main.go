// Command outboxd turns PostgreSQL writes into reliably delivered events.
//
// An application records an event in the same transaction as its business
// write (SELECT outbox.record(...)). outboxd's relay claims un-fanned events
// by row and enqueues one job per subscriber in its own job table, in the
// transaction that marks them fanned out; its workers run those jobs with
// retries, backoff and a rescuer. Every periodic bound on storage lives in
// retention.go, the operator's view in admin.go.
//
// Usage:
//
//	outboxd [flags]          run the service (no DATABASE_URL: a private
//	                         PostgreSQL cluster under -data-dir)
//	outboxd migrate [flags]  apply schema.sql and exit
//	outboxd secrets encrypt [flags]
//	                         seal every stored secret under -secrets-key
//	outboxd secrets rotate-key [flags]
//	                         the same, opening with -secrets-old-key too
//	outboxd version          print the build
//
// Every flag has an environment fallback, named in -help.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/lib/pq"
)

func main() {
	// Caught from the start, so that neither signal ever kills outboxd
	// by Go's default before stopOnSignals listens.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go stopOnSignals(signals, cancel, os.Stderr)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp): // -h: the usage is printed, and asking is no failure
	case err != nil:
		fmt.Fprintf(os.Stderr, "outboxd: %v\n", err)
		os.Exit(1)
	}
}

// exitStoppedAtOnce is the exit status of a stop at once, on a second
// signal: not 0, since work was left unfinished.
const exitStoppedAtOnce = 1

// stopOnSignals cancels the run at the first SIGINT or SIGTERM, which
// stops outboxd gracefully: the jobs in flight get -shutdown-grace to
// finish (workerPool.stop says which). At the second it exits at once,
// and the jobs in flight stay running in the database, held by this
// replica, to be rescued as after a crash (rescue.go): by the next start
// on this host, or by another replica once this one's dead_after has
// passed. It returns only with the process.
func stopOnSignals(signals <-chan os.Signal, cancel context.CancelFunc, stderr io.Writer) {
	<-signals
	cancel()
	sig := <-signals
	fmt.Fprintf(stderr, "outboxd: %v again: stopping at once; the jobs in flight are rescued as after a crash\n", sig)
	os.Exit(exitStoppedAtOnce)
}

// Config is every setting of outboxd, parsed once from flags and their
// environment fallbacks by parseConfig and validated there.
type Config struct {
	Command string // "" (serve), "migrate", secretsEncrypt or secretsRotateKey

	DatabaseURL string // empty: start the embedded cluster under DataDir
	DataDir     string
	Addr        string
	AdminToken  string
	LogFormat   string // text or json
	LogLevel    slog.Level

	// AllowPrivateEndpoints lets webhooks reach loopback and private
	// addresses: for development and tests only.
	AllowPrivateEndpoints bool
	Demo                  bool
	// EgressProxy is the HTTP CONNECT proxy every delivery goes through
	// (safehttp.go, egressProxy); empty: straight to the receiver.
	EgressProxy string

	// DisableListen turns LISTEN/NOTIFY off and leaves the sweeps to do all
	// the waking. PoolMode transaction implies it: poolers in transaction
	// mode (PgBouncer) silently swallow notifications.
	DisableListen bool
	// PoolMode is how the connections reach PostgreSQL: poolModeSession
	// (directly, or a pooler in session mode) or poolModeTransaction (a
	// pooler in transaction mode): no LISTEN, a shorter relay sweep, and
	// no session state across transactions (notify.go).
	PoolMode string
	// Migrate applies the migrations a database lacks at start. Off, a
	// start on a database that is not at this release fails, naming what
	// it lacks: for teams that apply DDL with their own tools, from what
	// PrintSQL prints.
	Migrate bool
	// PrintSQL, with the migrate command, prints the SQL that would bring
	// the database (or, with FromRelease, a database of that release: "none"
	// for an empty one) to this release, and applies nothing.
	PrintSQL    bool
	FromRelease string

	Relay     RelayConfig
	Workers   WorkerConfig
	Replicas  ReplicaConfig
	Webhooks  WebhookConfig
	Mail      MailConfig
	Retention RetentionConfig
	Alerts    AlertConfig

	// MetricsPublic serves /metrics without the admin token.
	MetricsPublic bool

	DBMaxConns int
	// NotifySocket is $NOTIFY_SOCKET, where systemd (Type=notify) waits to
	// hear that the service is ready; not a flag: systemd sets it.
	NotifySocket string
	// DatabaseWait is how long a start waits for an unreachable database,
	// trying again with a growing pause; a minute covers a PostgreSQL on
	// the same VM starting after outboxd, or restarting. Errors no wait
	// can fix fail at once (waitCanFix, database.go).
	DatabaseWait  time.Duration
	ShutdownGrace time.Duration

	// SecretsKey seals the secrets of endpoints and inbox sources at rest
	// (secrets.go): 32 bytes in standard base64. Empty stores them as they
	// are, and refuses a sealed one.
	SecretsKey string
	// SecretsOldKey opens what it sealed and seals nothing: the key being
	// rotated out, for `secrets rotate-key` and for the replicas running
	// meanwhile.
	SecretsOldKey string
	// TLSCert and TLSKey, PEM files given both or neither, serve HTTPS.
	// InsecureHTTP serves plain HTTP on an address beyond loopback, for a
	// proxy in front that terminates TLS; without one of the two, such an
	// address is refused (validateService).
	TLSCert      string
	TLSKey       string
	InsecureHTTP bool
	// PublicURL is where browsers reach outboxd, through whatever proxy
	// is in front (https://outboxd.example.com): the one thing that
	// tells outboxd, served plain HTTP by a proxy that terminates TLS,
	// that its cookies must be Secure and that it may send HSTS. Empty:
	// the scheme of each request as it arrived (parsePublicURL).
	PublicURL string
	// TrustedProxies are the proxies in front whose X-Forwarded-For and
	// X-Forwarded-Proto outboxd believes (clientAddr, httpserve.go); from
	// any other peer those headers are the client's own, and ignored.
	TrustedProxies prefixList
	// SigninLinkLifetime is how long a sign-in link the admin makes for an
	// owner (owners.go) stays good, unless it is used first.
	SigninLinkLifetime time.Duration
}

// The secrets commands (secrets.go): both seal every stored secret under
// -secrets-key; rotate-key requires the old key to open what it sealed.
const (
	secretsEncrypt   = "secrets encrypt"
	secretsRotateKey = "secrets rotate-key"
)

// defaultConfig is the configuration with every default; each number's
// reason sits on its field. main_test.go pins them.
func defaultConfig() Config {
	c := Config{
		DataDir:   "outboxd-data",
		Addr:      "127.0.0.1:8080",
		LogFormat: "text",
		LogLevel:  slog.LevelInfo,
		PoolMode:  poolModeSession,
		Migrate:   true,
		Relay: RelayConfig{
			BatchSize:            200,
			MaxFailures:          5,
			SweepInterval:        time.Minute,
			BusyLinger:           100 * time.Millisecond,
			BusyRecheck:          5 * time.Millisecond,
			FailingEndpointDelay: 5 * time.Minute,
			PassTimeout:          5 * time.Second,
		},
		Workers: WorkerConfig{
			Concurrency:      128,
			MaxAttempts:      18,
			AttemptTimeout:   30 * time.Second,
			RescueMargin:     time.Minute,
			PollInterval:     time.Second,
			RescueInterval:   30 * time.Second,
			BreakerThreshold: 5,
		},
		Replicas: ReplicaConfig{
			Heartbeat: 3 * time.Second,
			DeadAfter: 15 * time.Second,
		},
		Webhooks: WebhookConfig{
			Timeout:              30 * time.Second,
			SecretRotationWindow: 24 * time.Hour,
		},
		Mail: MailConfig{
			OwnerNotifyPerHour: 5,
		},
		Alerts:        defaultAlerts(),
		Retention:     defaultRetention(),
		DBMaxConns:    20,
		DatabaseWait:  time.Minute,
		ShutdownGrace: 30 * time.Second,
	}
	c.SigninLinkLifetime = defaultSigninLinkLifetime
	c.derive(false)
	return c
}

// defaultAlerts are the alerts' thresholds (AlertConfig says why each).
func defaultAlerts() AlertConfig {
	return AlertConfig{
		BacklogRows:          1000,
		BacklogAge:           5 * time.Minute,
		DeadRatio:            0.2,
		XactAge:              time.Hour,
		EndpointSuccessBelow: 0.5,
		EndpointFailingFor:   3 * time.Minute,
		ClientCertExpiry:     14 * 24 * time.Hour,
	}
}

// defaultRetention is how long each table keeps its rows, and how the
// sweeps delete them.
func defaultRetention() RetentionConfig {
	return RetentionConfig{
		Events: 7 * 24 * time.Hour,
		// Inbox: defaultInboxRetention, from the settings it must cover
		// (derive).
		CompletedJobs: 24 * time.Hour,
		DiscardedJobs: 7 * 24 * time.Hour,
		// DeliveryStats: a week, to compare today with the same day last
		// week; 10,080 rows an endpoint at most.
		DeliveryStats:        7 * 24 * time.Hour,
		Interval:             time.Hour,
		BatchSize:            retentionBatchMax,
		AnomalyCap:           1_000_000,
		EndpointDisableAfter: 5 * 24 * time.Hour,
		Audit:                defaultAuditRetention,
	}
}

// derive sets the settings that follow from others: the inbox window,
// unless it was given, the resend horizon the receiver_window_short
// alert holds receivers' windows against, and the retention interval
// retention_failed awaits cycles by.
func (c *Config) derive(inboxGiven bool) {
	if !inboxGiven {
		c.Retention.Inbox = c.defaultInboxRetention()
	}
	c.Alerts.ResendHorizon = resendHorizon(c.Retention.Events, c.Workers.MaxAttempts)
	c.Alerts.RetentionInterval = c.Retention.Interval
}

// derivePoolMode sets what transaction mode changes (notify.go, the pool
// modes): no LISTEN, the relay's sweep unless -relay-sweep was given, and
// the retention lock's scope.
func (c *Config) derivePoolMode(relaySweepGiven bool) {
	if c.PoolMode != poolModeTransaction {
		return
	}
	if !relaySweepGiven {
		c.Relay.SweepInterval = transactionModeRelaySweep
	}
	c.DisableListen = true // a LISTEN through the pooler reaches nobody
	c.Retention.XactLocks = true
}

// inboxRetentionMargin is the least an inbox keeps its records beyond
// events retention, whatever the dedup rule asks (replay.go): the seed's
// floor, a day.
const inboxRetentionMargin = 24 * time.Hour

// defaultInboxRetention is the inbox window when -inbox-retention is not
// given: the first whole number of days the dedup rule accepts (replay.go;
// 12 days at the defaults), so that an operator who keeps events longer,
// or retries more, keeps their dedup records longer too. Events kept
// forever keep their dedup records forever (0).
func (c Config) defaultInboxRetention() time.Duration {
	r := c.Retention
	horizon := resendHorizon(r.Events, c.Workers.MaxAttempts)
	if horizon == 0 {
		return 0
	}
	const day = 24 * time.Hour
	// The rule wants inbox - interval > horizon.
	return max((horizon+r.Interval)/day*day+day, r.Events+inboxRetentionMargin)
}

// commands are outboxd's subcommands, as -h lists them.
var commands = []struct{ name, summary string }{
	{"serve", "run the service, the default: relay, workers, sweeps and the HTTP listener"},
	{"migrate", "bring the database to this release and exit; -print-sql prints the SQL instead"},
	{secretsEncrypt, "seal every stored secret under -secrets-key"},
	{secretsRotateKey, "seal every stored secret again, from -secrets-old-key to -secrets-key"},
	{"version", "print the release, module version, VCS revision and Go version"},
}

// parseConfig reads flags from args and, for every flag not given there, its
// environment variable. The result is validated; an error names the setting
// and its bad value.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	cfg := defaultConfig()
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cfg.Command, args = args[0], args[1:]
		if cfg.Command == "secrets" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			cfg.Command, args = cfg.Command+" "+args[0], args[1:]
		}
		switch cfg.Command {
		case "serve":
			cfg.Command = ""
		case "migrate", secretsEncrypt, secretsRotateKey:
		default:
			return cfg, fmt.Errorf("unknown command %q; outboxd -h lists them", cfg.Command)
		}
	}

	fs := configFlags(&cfg, stderr)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given, err := applyEnv(fs, getenv)
	if err != nil {
		return cfg, err
	}
	cfg.derive(given["inbox-retention"])
	cfg.derivePoolMode(given["relay-sweep"])
	cfg.NotifySocket = getenv("NOTIFY_SOCKET")
	return cfg, cfg.validate()
}

// databaseFlags registers how outboxd reaches its database and brings
// the schema to this release.
func databaseFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "PostgreSQL connection URL; empty starts a private cluster under -data-dir")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "folder of the private PostgreSQL cluster used when -database-url is empty")
	fs.IntVar(&cfg.DBMaxConns, "db-max-conns", cfg.DBMaxConns, "most open database connections of the pool")
	fs.DurationVar(&cfg.DatabaseWait, "database-wait", cfg.DatabaseWait, "how long a start waits for a database that refuses connections or is starting up, trying again; what no wait can fix (a login refused, no such role or database) fails at once; 0 fails at once")
	fs.StringVar(&cfg.PoolMode, "pool-mode", cfg.PoolMode, "session, or transaction behind a pooler in transaction mode (PgBouncer): no LISTEN, -relay-sweep 1s unless given, retention locks per batch")
	fs.BoolVar(&cfg.Migrate, "migrate", cfg.Migrate, "apply the schema's missing migrations at start; false refuses to start on a database that is not at this release, naming what it lacks")
	fs.BoolVar(&cfg.PrintSQL, "print-sql", cfg.PrintSQL, "with migrate: print the SQL that would bring the database to this release, for your own migration tools, and apply nothing")
	fs.StringVar(&cfg.FromRelease, "from-release", cfg.FromRelease, "with migrate -print-sql: print the SQL from this release (0.1.0, ...; none: an empty database) without reading the database")
}

// alertFlags registers the alert thresholds, AlertConfig's settings.
func alertFlags(fs *flag.FlagSet, a *AlertConfig) {
	fs.IntVar(&a.BacklogRows, "alert-backlog", a.BacklogRows, "un-fanned events above which events_backlog fires")
	fs.DurationVar(&a.BacklogAge, "alert-backlog-age", a.BacklogAge, "age of the oldest un-fanned event above which events_backlog fires")
	fs.Float64Var(&a.DeadRatio, "alert-dead-ratio", a.DeadRatio, "share of dead rows in outbox.events or outbox.jobs above which table_bloat fires")
	fs.DurationVar(&a.XactAge, "alert-xact-age", a.XactAge, "age of the oldest snapshot-holding transaction above which old_transaction fires")
	fs.Float64Var(&a.EndpointSuccessBelow, "alert-endpoint-success-below", a.EndpointSuccessBelow, "share of an endpoint's attempts succeeding below which, for -alert-endpoint-failing-for, endpoint_failing fires")
	fs.DurationVar(&a.EndpointFailingFor, "alert-endpoint-failing-for", a.EndpointFailingFor, "how long an endpoint's success rate stays below -alert-endpoint-success-below before endpoint_failing fires")
	fs.DurationVar(&a.ClientCertExpiry, "alert-client-cert-expiry", a.ClientCertExpiry, "how long before an endpoint's client certificate expires client_certificate_expiring fires")
}

// configFlags declares every flag of cfg, with cfg's values as defaults,
// on a new flag set writing its usage to stderr. One flag a line: a long
// list is the point of this function.
func configFlags(cfg *Config, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("outboxd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Addr, "addr", cfg.Addr, "HTTP listen address")
	fs.StringVar(&cfg.AdminToken, "admin-token", cfg.AdminToken, "bearer token for /api/ and the panel; empty generates one at start")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "log format: text or json")
	fs.TextVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log level: debug, info, warn or error")
	fs.BoolVar(&cfg.AllowPrivateEndpoints, "allow-private-endpoints", cfg.AllowPrivateEndpoints, "deliver to loopback and private addresses (development and tests only)")
	fs.StringVar(&cfg.EgressProxy, "egress-proxy", cfg.EgressProxy, "HTTP CONNECT proxy every webhook and probe goes through: http(s)://[user:password@]host:port; empty: connect directly")
	fs.BoolVar(&cfg.Demo, "demo", cfg.Demo, "create a watched sample table and write to it, to show events flowing")
	fs.BoolVar(&cfg.DisableListen, "disable-listen", cfg.DisableListen, "do not LISTEN; rely on the sweeps alone (-pool-mode transaction implies it)")
	databaseFlags(fs, cfg)
	fs.IntVar(&cfg.Relay.BatchSize, "relay-batch", cfg.Relay.BatchSize, "most events claimed by one relay transaction")
	fs.IntVar(&cfg.Relay.MaxFailures, "relay-max-failures", cfg.Relay.MaxFailures, "failed relay attempts after which an event is poisoned")
	fs.DurationVar(&cfg.Relay.SweepInterval, "relay-sweep", cfg.Relay.SweepInterval, "relay pass interval without a notification")
	fs.DurationVar(&cfg.Relay.FailingEndpointDelay, "failing-endpoint-delay", cfg.Relay.FailingEndpointDelay, "how far out new deliveries are scheduled while an endpoint's circuit breaker is open")
	fs.DurationVar(&cfg.Relay.PassTimeout, "relay-pass-timeout", cfg.Relay.PassTimeout, "longest relay statement; past it, the endpoints' filters that fail alone are held (0: no bound)")
	fs.IntVar(&cfg.Workers.BreakerThreshold, "breaker-threshold", cfg.Workers.BreakerThreshold, "failed attempts in a row that open an endpoint's circuit breaker (one attempt at a time, new deliveries -failing-endpoint-delay out); 1 opens it at the first failure")
	fs.IntVar(&cfg.Workers.Concurrency, "workers", cfg.Workers.Concurrency, "jobs run at once by this process")
	fs.IntVar(&cfg.Workers.MaxAttempts, "job-max-attempts", cfg.Workers.MaxAttempts, "attempts before a failing job is discarded; each job keeps the value in force when it was made (fanned out or replayed), so a change applies to new jobs only")
	fs.DurationVar(&cfg.Workers.AttemptTimeout, "job-timeout", cfg.Workers.AttemptTimeout, "time limit of one job attempt")
	fs.DurationVar(&cfg.Workers.RescueMargin, "job-rescue-margin", cfg.Workers.RescueMargin, "added to -job-timeout before a running job is rescued")
	fs.DurationVar(&cfg.Workers.PollInterval, "job-poll", cfg.Workers.PollInterval, "interval at which workers look for due jobs without a notification")
	fs.DurationVar(&cfg.Workers.RescueInterval, "job-rescue-interval", cfg.Workers.RescueInterval, "interval at which the rescuer looks for stuck jobs")
	fs.DurationVar(&cfg.Replicas.Heartbeat, "replica-heartbeat", cfg.Replicas.Heartbeat, "interval at which this replica stamps its row in outbox.replicas, and looks for replicas that stopped")
	fs.DurationVar(&cfg.Replicas.DeadAfter, "replica-dead-after", cfg.Replicas.DeadAfter, "a replica without a heartbeat for this long is declared dead and its running jobs are rescued; at least 3 heartbeats")
	alertFlags(fs, &cfg.Alerts)
	fs.BoolVar(&cfg.MetricsPublic, "metrics-public", cfg.MetricsPublic, "serve /metrics without the admin token")
	fs.DurationVar(&cfg.Webhooks.Timeout, "webhook-timeout", cfg.Webhooks.Timeout, "time limit of one webhook request, reading the answer included")
	fs.DurationVar(&cfg.Webhooks.SecretRotationWindow, "webhook-secret-rotation-window", cfg.Webhooks.SecretRotationWindow, "how long a rotated-out endpoint secret still signs deliveries")
	fs.DurationVar(&cfg.Retention.Events, "events-retention", cfg.Retention.Events, "delete fanned events this long after fan-out once their jobs are completed; 0 keeps them")
	fs.DurationVar(&cfg.Retention.Inbox, "inbox-retention", cfg.Retention.Inbox, "delete inbox records this long after receipt; must exceed -events-retention + the retry horizon of -job-max-attempts + -retention-interval, and -events-retention by a day; default the first whole day that does (288h); 0 keeps them")
	fs.DurationVar(&cfg.Retention.CompletedJobs, "completed-jobs-retention", cfg.Retention.CompletedJobs, "delete completed jobs this long after they finished; 0 keeps them")
	fs.DurationVar(&cfg.Retention.DiscardedJobs, "discarded-jobs-retention", cfg.Retention.DiscardedJobs, "delete discarded jobs this long after they finished; 0 keeps them")
	fs.DurationVar(&cfg.Retention.DeliveryStats, "delivery-stats-retention", cfg.Retention.DeliveryStats, "delete per-minute delivery statistics this long after their minute; 0 keeps them")
	fs.DurationVar(&cfg.Retention.Interval, "retention-interval", cfg.Retention.Interval, "cadence of the retention sweeps")
	fs.IntVar(&cfg.Retention.BatchSize, "retention-batch", cfg.Retention.BatchSize, "most rows one retention DELETE removes")
	fs.DurationVar(&cfg.Retention.EndpointDisableAfter, "endpoint-disable-after", cfg.Retention.EndpointDisableAfter, "disable an endpoint failing continuously this long; 0 never does")
	fs.IntVar(&cfg.Retention.AnomalyCap, "retention-anomaly-cap", cfg.Retention.AnomalyCap, "most rows one sweep deletes in a cycle before it stops and warns")
	fs.DurationVar(&cfg.Retention.Audit, "audit-retention", cfg.Retention.Audit, "delete audit trail entries this long after the change they record; 0 keeps them")
	fs.DurationVar(&cfg.SigninLinkLifetime, "signin-link-lifetime", cfg.SigninLinkLifetime, "how long a sign-in link made for an endpoint owner stays good; each signs in once")
	fs.StringVar(&cfg.Mail.SMTPURL, "smtp-url", cfg.Mail.SMTPURL, "SMTP server for mailto: endpoints and owner notifications: smtp://user:pass@host:port (STARTTLS when offered) or smtps://...; empty: mail jobs complete and log")
	fs.StringVar(&cfg.Mail.From, "smtp-from", cfg.Mail.From, "sender address of every mail")
	fs.StringVar(&cfg.Mail.MessageIDHost, "smtp-message-id-host", cfg.Mail.MessageIDHost, "host part of Message-ID <event id@host>; empty: the domain of -smtp-from")
	fs.IntVar(&cfg.Mail.OwnerNotifyPerHour, "owner-notify-per-hour", cfg.Mail.OwnerNotifyPerHour, "most mails per endpoint owner per hour about failing or disabled endpoints")
	fs.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", cfg.ShutdownGrace, "time in-flight work gets to finish on SIGTERM or Ctrl-C; a second signal stops at once, and what was in flight is rescued as after a crash")
	fs.StringVar(&cfg.SecretsKey, "secrets-key", cfg.SecretsKey, "key that seals endpoint and source secrets at rest: 32 bytes in standard base64 (openssl rand -base64 32); empty stores them unsealed")
	fs.StringVar(&cfg.SecretsOldKey, "secrets-old-key", cfg.SecretsOldKey, "the key being rotated out: opens the secrets it sealed, seals none (outboxd secrets rotate-key)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate (chain) file; with -tls-key, serve HTTPS")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM private key file of -tls-cert")
	fs.BoolVar(&cfg.InsecureHTTP, "insecure-http", cfg.InsecureHTTP, "serve plain HTTP on an address other than loopback (behind a proxy that terminates TLS)")
	fs.StringVar(&cfg.PublicURL, "public-url", cfg.PublicURL, "the http(s) URL browsers reach outboxd at, through any proxy in front; https makes the session cookie Secure and sends HSTS")
	fs.Var(&cfg.TrustedProxies, "trusted-proxies", "comma-separated addresses or CIDR prefixes of the proxies in front, whose X-Forwarded-For and X-Forwarded-Proto are believed")
	fs.Usage = func() { printUsage(fs, cfg.Command) }
	return fs
}

// printUsage is -h: the commands, then every flag with its environment
// variable and default.
func printUsage(fs *flag.FlagSet, command string) {
	if command == "" {
		command = "[command]"
	}
	fmt.Fprintf(fs.Output(), "Usage: outboxd %s [flags]\n\nCommands:\n", command)
	for _, c := range commands {
		fmt.Fprintf(fs.Output(), "  %-20s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(fs.Output(), "\nFlags of serve, migrate and secrets; every flag falls back to an environment variable:\n\n")
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(fs.Output(), "  -%s  (%s, default %q)\n    \t%s\n", f.Name, envName(f.Name), f.DefValue, f.Usage)
	})
}

// applyEnv sets every flag not given on the command line from its
// environment variable, if set, and reports which flags were given either
// way.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) (map[string]bool, error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || envErr != nil {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
			given[f.Name] = true
		}
	})
	return given, envErr
}

// validate checks every setting once, at start. Each error names the flag
// and its environment variable so the operator finds it either way.
func (c Config) validate() error {
	if err := c.validateService(); err != nil {
		return err
	}
	return errors.Join(
		intIn("relay-batch", c.Relay.BatchSize, 1, 10_000),
		intIn("relay-max-failures", c.Relay.MaxFailures, 1, 100),
		durationIn("relay-sweep", c.Relay.SweepInterval, 10*time.Millisecond, time.Hour),
		durationIn("failing-endpoint-delay", c.Relay.FailingEndpointDelay, 0, 24*time.Hour),
		durationIn("relay-pass-timeout", c.Relay.PassTimeout, 0, time.Hour),
		intIn("workers", c.Workers.Concurrency, 1, 1_000),
		intIn("job-max-attempts", c.Workers.MaxAttempts, 1, 100),
		intIn("breaker-threshold", c.Workers.BreakerThreshold, 1, 1_000),
		durationIn("job-timeout", c.Workers.AttemptTimeout, 10*time.Millisecond, time.Hour),
		durationIn("job-rescue-margin", c.Workers.RescueMargin, 0, 24*time.Hour),
		durationIn("job-poll", c.Workers.PollInterval, 10*time.Millisecond, time.Hour),
		durationIn("job-rescue-interval", c.Workers.RescueInterval, 10*time.Millisecond, time.Hour),
		durationIn("replica-heartbeat", c.Replicas.Heartbeat, 10*time.Millisecond, time.Minute),
		durationIn("replica-dead-after", c.Replicas.DeadAfter, time.Second, time.Hour),
		c.validateReplicas(),
		intIn("alert-backlog", c.Alerts.BacklogRows, 0, 100_000_000),
		durationIn("alert-backlog-age", c.Alerts.BacklogAge, time.Second, 7*24*time.Hour),
		durationIn("alert-xact-age", c.Alerts.XactAge, time.Second, 7*24*time.Hour),
		shareIn("alert-dead-ratio", c.Alerts.DeadRatio),
		shareIn("alert-endpoint-success-below", c.Alerts.EndpointSuccessBelow),
		durationIn("alert-endpoint-failing-for", c.Alerts.EndpointFailingFor, time.Second, 24*time.Hour),
		durationIn("alert-client-cert-expiry", c.Alerts.ClientCertExpiry, 0, 365*24*time.Hour),
		validateEgressProxy(c.EgressProxy),
		durationIn("webhook-timeout", c.Webhooks.Timeout, 10*time.Millisecond, 10*time.Minute),
		durationIn("webhook-secret-rotation-window", c.Webhooks.SecretRotationWindow, 0, 30*24*time.Hour),
		validateRetryHorizon(c.Workers.MaxAttempts, c.Retention.Events),
		c.Mail.validate(),
		intIn("owner-notify-per-hour", c.Mail.OwnerNotifyPerHour, 1, 1_000),
		intIn("db-max-conns", c.DBMaxConns, 4, 1_000),
		durationIn("database-wait", c.DatabaseWait, 0, time.Hour),
		durationIn("shutdown-grace", c.ShutdownGrace, 0, time.Hour),
		durationIn("events-retention", c.Retention.Events, 0, maxRetention),
		durationIn("inbox-retention", c.Retention.Inbox, 0, maxRetention),
		durationIn("completed-jobs-retention", c.Retention.CompletedJobs, 0, maxRetention),
		durationIn("discarded-jobs-retention", c.Retention.DiscardedJobs, 0, maxRetention),
		durationIn("delivery-stats-retention", c.Retention.DeliveryStats, 0, maxRetention),
		durationIn("retention-interval", c.Retention.Interval, time.Second, 24*time.Hour),
		intIn("retention-batch", c.Retention.BatchSize, 1, retentionBatchMax),
		durationIn("endpoint-disable-after", c.Retention.EndpointDisableAfter, 0, maxRetention),
		intIn("retention-anomaly-cap", c.Retention.AnomalyCap, 1, 1_000_000_000),
		durationIn("audit-retention", c.Retention.Audit, 0, maxRetention),
		durationIn("signin-link-lifetime", c.SigninLinkLifetime, minSigninLinkLifetime, maxSigninLinkLifetime),
		c.validateInboxRetention(),
	)
}

// intIn, durationIn and shareIn are validate's range checks: each error
// names the setting, its range and the value given.
func intIn(name string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s must be between %d and %d, got %d", setting(name), lo, hi, v)
	}
	return nil
}

func durationIn(name string, v, lo, hi time.Duration) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s must be between %s and %s, got %s", setting(name), lo, hi, v)
	}
	return nil
}

func shareIn(name string, v float64) error {
	if !(v > 0 && v <= 1) { // NaN too
		return fmt.Errorf("%s must be above 0 and at most 1, got %v", setting(name), v)
	}
	return nil
}

// validateReplicas refuses a dead_after that a few late heartbeats could
// reach: a live replica would be declared dead, and its jobs run twice.
func (c Config) validateReplicas() error {
	r := c.Replicas
	if r.Heartbeat > 0 && r.DeadAfter < minBeatsPerDeadAfter*r.Heartbeat {
		return fmt.Errorf("%s = %s must be at least %d × %s = %s (%s), so that a replica missing one heartbeat is not declared dead",
			setting("replica-dead-after"), r.DeadAfter, minBeatsPerDeadAfter, setting("replica-heartbeat"), r.Heartbeat,
			minBeatsPerDeadAfter*r.Heartbeat)
	}
	return nil
}

// validateMigrate checks the migration settings: the printing flags
// belong to the migrate command, and a release to print from is one this
// binary has.
func (c Config) validateMigrate() error {
	if c.Command != "migrate" && (c.PrintSQL || c.FromRelease != "") {
		return fmt.Errorf("%s and %s are flags of outboxd migrate", setting("print-sql"), setting("from-release"))
	}
	if c.FromRelease != "" && !c.PrintSQL {
		return fmt.Errorf("%s goes with %s", setting("from-release"), setting("print-sql"))
	}
	if c.Command == "migrate" && !c.Migrate && !c.PrintSQL {
		return fmt.Errorf("outboxd migrate with %s=false has nothing to do: leave it on, or add %s", setting("migrate"), setting("print-sql"))
	}
	if c.FromRelease != "" && c.FromRelease != "none" {
		if _, err := migrationsAfter(embeddedMigrations(), c.FromRelease); err != nil {
			return fmt.Errorf("%s: %w", setting("from-release"), err)
		}
	}
	return nil
}

// validateService checks where outboxd connects and listens, and how it
// logs: the settings without a numeric range.
func (c Config) validateService() error {
	if c.DatabaseURL != "" {
		if _, err := pq.NewConfig(c.DatabaseURL); err != nil {
			// The driver's message quotes the URL, password and all.
			return fmt.Errorf("%s: %s", setting("database-url"), redactDSN(err.Error(), c.DatabaseURL))
		}
	} else if c.DataDir == "" {
		return fmt.Errorf("%s must not be empty when %s is", setting("data-dir"), setting("database-url"))
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("%s: %q is not host:port: %w", setting("addr"), c.Addr, err)
	}
	if err := validateAdminToken(c.AdminToken); err != nil {
		return err
	}
	if _, err := parsePublicURL(c.PublicURL); err != nil {
		return err
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("%s must be text or json, got %q", setting("log-format"), c.LogFormat)
	}
	if c.PoolMode != poolModeSession && c.PoolMode != poolModeTransaction {
		return fmt.Errorf("%s must be %s or %s, got %q", setting("pool-mode"), poolModeSession, poolModeTransaction, c.PoolMode)
	}
	if err := c.validateMigrate(); err != nil {
		return err
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("%s and %s go together: give both or neither", setting("tls-cert"), setting("tls-key"))
	}
	// Beyond loopback, the admin token and the panel's session cross a
	// network: in the clear only if the operator says a proxy encrypts
	// them, and never a token made up at start, which is in the log and
	// changes with every restart.
	if !isLoopbackHost(c.Addr) {
		if c.AdminToken == "" {
			return fmt.Errorf("%s %s is not a loopback address: set %s rather than have one generated and logged",
				setting("addr"), c.Addr, setting("admin-token"))
		}
		if c.TLSCert == "" && !c.InsecureHTTP {
			return fmt.Errorf("%s %s is not a loopback address: serve HTTPS with %s and %s, or give %s if a proxy in front terminates TLS",
				setting("addr"), c.Addr, setting("tls-cert"), setting("tls-key"), setting("insecure-http"))
		}
	}
	return c.validateSecrets()
}

// validateSecrets checks the sealing keys and that a secrets command has
// the keys it needs.
func (c Config) validateSecrets() error {
	if _, err := c.secretBox(); err != nil {
		return err
	}
	switch {
	case (c.Command == secretsEncrypt || c.Command == secretsRotateKey) && c.SecretsKey == "":
		return fmt.Errorf("outboxd %s seals under %s, which is not set", c.Command, setting("secrets-key"))
	case c.Command == secretsRotateKey && c.SecretsOldKey == "":
		return fmt.Errorf("outboxd %s needs the key it rotates out in %s", c.Command, setting("secrets-old-key"))
	}
	return nil
}

// minAdminTokenBits is the least estimated entropy a configured admin
// token may have (validateAdminToken): 128 bits, a random UUID's or a
// 16-byte key's, beyond any guessing, online (throttled at one address's
// authFailureRefill, admin.go) or offline (the token's fingerprint in
// outbox.panel_session_token). The token outboxd generates has 192.
const minAdminTokenBits = 128

// validateAdminToken refuses a configured admin token that is a
// placeholder or easy to guess. Its entropy is estimated as if it were
// random: length × log2 of the alphabet its characters come from
// (adminTokenAlphabet), at least minAdminTokenBits; and no character
// may make up more than a third of it, which refuses a repetition the
// estimate rates by its length (aaaa..., abab...) and leaves a random
// token alone: at the shortest length the estimate allows, a third is
// reached by chance once in 7,500 tokens of digits alone, once in 29,000
// of hex digits, and far more rarely in any larger alphabet. The
// estimate cannot see a phrase: it refuses what is short, repeated or of
// one kind. Errors name the setting, never the token.
func validateAdminToken(token string) error {
	if token == "" {
		return nil // generated at start
	}
	const generate = "generate one, such as with openssl rand -hex 32"
	if lower := strings.ToLower(token); strings.Contains(lower, "change-me") || strings.Contains(lower, "changeme") {
		return fmt.Errorf("%s is a placeholder (change-me...): %s", setting("admin-token"), generate)
	}
	n := utf8.RuneCountInString(token)
	alphabet, kinds := adminTokenAlphabet(token)
	if bits := float64(n) * math.Log2(float64(alphabet)); bits < minAdminTokenBits {
		return fmt.Errorf("%s is too easy to guess: %d characters of %s (an alphabet of %d) make an estimated %.0f bits, at least %d are needed; %s",
			setting("admin-token"), n, kinds, alphabet, bits, minAdminTokenBits, generate)
	}
	counts := map[rune]int{}
	for _, r := range token {
		if counts[r]++; 3*counts[r] > n {
			return fmt.Errorf("%s is too easy to guess: one character makes up more than a third of its %d; %s", setting("admin-token"), n, generate)
		}
	}
	return nil
}

// adminTokenAlphabet is the size of the alphabet token's characters come
// from, and its name: 10 for digits alone, 16 for hex digits alone;
// otherwise the sum of the kinds present, lowercase letters 26, capitals
// 26, digits 10, and 33 for any other (ASCII's punctuation and space).
func adminTokenAlphabet(token string) (int, string) {
	var lower, upper, digit, other bool
	hex := true
	for _, r := range token {
		switch {
		case 'a' <= r && r <= 'z':
			lower, hex = true, hex && r <= 'f'
		case 'A' <= r && r <= 'Z':
			upper, hex = true, hex && r <= 'F'
		case '0' <= r && r <= '9':
			digit = true
		default:
			other, hex = true, false
		}
	}
	switch {
	case digit && !lower && !upper && !other:
		return 10, "digits"
	case hex:
		return 16, "hex digits"
	}
	size, kinds := 0, []string{}
	for _, k := range []struct {
		present bool
		name    string
		size    int
	}{{lower, "lowercase letters", 26}, {upper, "capitals", 26}, {digit, "digits", 10}, {other, "other characters", 33}} {
		if k.present {
			size, kinds = size+k.size, append(kinds, k.name)
		}
	}
	return size, strings.Join(kinds, ", ")
}

// parsePublicURL is -public-url, nil when it is empty. outboxd's pages
// link and redirect by absolute paths, so it is served from the root of
// its URL: a path is refused, as are credentials, a query and a fragment.
func parsePublicURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" ||
		u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, fmt.Errorf("%s must be an absolute http or https URL of outboxd's root, such as https://outboxd.example.com, got %q",
			setting("public-url"), s)
	}
	u.Path = ""
	return u, nil
}

// secretBox is the sealing -secrets-key and -secrets-old-key configure:
// nil, and no error, without a key. Its errors name the setting and never
// quote a key.
func (c Config) secretBox() (*secretBox, error) {
	if c.SecretsKey == "" {
		if c.SecretsOldKey != "" {
			return nil, fmt.Errorf("%s is set without %s", setting("secrets-old-key"), setting("secrets-key"))
		}
		return nil, nil
	}
	current, err := parseSecretsKey(c.SecretsKey)
	if err != nil {
		return nil, fmt.Errorf("%s %w", setting("secrets-key"), err)
	}
	var old *sealKey
	if c.SecretsOldKey != "" {
		if old, err = parseSecretsKey(c.SecretsOldKey); err != nil {
			return nil, fmt.Errorf("%s %w", setting("secrets-old-key"), err)
		}
	}
	box, err := newSecretBox(current, old)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", setting("secrets-old-key"), err)
	}
	return box, nil
}

// validateRetryHorizon refuses a retry schedule that can outlive the event
// it delivers: a retry must never find its event pruned by retention.
// eventsRetention 0 means retention is off, and nothing is pruned.
func validateRetryHorizon(maxAttempts int, eventsRetention time.Duration) error {
	if eventsRetention <= 0 || maxAttempts < 1 {
		return nil
	}
	if h := retryHorizon(maxAttempts); h >= eventsRetention {
		return fmt.Errorf("%s %d retries for up to %s, which is not shorter than the events retention of %s: lower the attempts or raise the retention",
			setting("job-max-attempts"), maxAttempts, h.Round(time.Minute), eventsRetention)
	}
	return nil
}

// validateInboxRetention refuses an inbox window that a sender configured
// like this outboxd could outlive (the dedup rule, replay.go): a resend
// after the record is gone is recorded twice. An inbox that keeps its
// records (0) is always safe. Events kept forever (0) with a bounded inbox
// are refused: a replay may resend an event of any age, and the inbox
// would have forgotten it. (An outboxd sender clamps its replays to the
// window a receiver advertises, but other senders do not.)
func (c Config) validateInboxRetention() error {
	r := c.Retention
	switch {
	case r.Inbox == 0:
		return nil
	case r.Events == 0:
		return fmt.Errorf("%s = %s bounds the inbox, but %s = 0 keeps events, and lets a replay resend them, forever: set %s to 0 too, or bound events retention",
			setting("inbox-retention"), r.Inbox, setting("events-retention"), setting("inbox-retention"))
	case windowCovers(advertisedWindow(r.Inbox, r.Interval), resendHorizon(r.Events, c.Workers.MaxAttempts)) && r.Inbox >= r.Events+inboxRetentionMargin:
		return nil
	}
	h := retryHorizon(c.Workers.MaxAttempts)
	return fmt.Errorf("%s = %s must be longer than %s = %s + the retry horizon of %s = %d (%s) + %s = %s = %s, and a day longer than events retention, "+
		"so that an inbox record outlives every resend of its event (left unset it is %s)",
		setting("inbox-retention"), r.Inbox, setting("events-retention"), r.Events, setting("job-max-attempts"), c.Workers.MaxAttempts, h,
		setting("retention-interval"), r.Interval, r.Events+h+r.Interval, c.defaultInboxRetention())
}

// run is outboxd: it parses the configuration, connects (starting the
// embedded cluster if needed) and applies the schema; then it runs the
// command, by default the service.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "version" {
		return printVersion(args[1:], stdout, stderr)
	}
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	box, err := cfg.secretBox()
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)

	if cfg.PrintSQL && cfg.FromRelease != "" {
		return printMigrationSQL(stdout, newMigration(nil), cfg.FromRelease)
	}
	db, dsn, closeDB, err := connect(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer closeDB()
	switch cfg.Command {
	case "migrate":
		if cfg.PrintSQL {
			return printDatabaseMigrationSQL(ctx, stdout, db)
		}
		logger.Info("the schema is at this release", "release", version)
		return nil
	case secretsEncrypt, secretsRotateKey:
		_, err := sealStoredSecrets(ctx, db, box, logger)
		return err
	}
	return runService(ctx, cfg, db, dsn, box, logger, stdout)
}

// printVersion is `outboxd version`: it takes no flag but -h.
func printVersion(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("outboxd version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, readBuildInfo())
	return nil
}

// runService runs every loop and the HTTP server until ctx ends, then
// stops them all and waits for each. The loops end with ctx (SIGTERM), or
// when runService returns early on an error; the workers then give
// in-flight jobs the grace period. The heartbeat goes on until they have
// stopped, so that no other replica declares this one dead while it
// finishes its jobs; then its row is deleted.
func runService(ctx context.Context, cfg Config, db *sql.DB, dsn string, box *secretBox, logger *slog.Logger, stdout io.Writer) error {
	checkServerSettings(ctx, db, logger)
	if box != nil {
		logger.Info("endpoint and source secrets are sealed at rest", "keys", box)
	} else {
		warnSealedWithoutKey(ctx, db, logger)
	}

	// Listen before the loops start: a taken port fails the start at once,
	// and the demo needs the address for its endpoint.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	defer ln.Close()
	var demoRun *demo
	if cfg.Demo {
		demoRun = newDemo(db, box, ln.Addr().(*net.TCPAddr).AddrPort(), logger)
	}

	p := newPipeline(cfg, db, box, demoRun, logger)
	registry, err := registerReplica(ctx, db, cfg, p.workers.kinds(), logger)
	if err != nil {
		return err
	}
	loops := newLoopGroup(ctx, logger)
	heartbeat := newLoopGroup(context.WithoutCancel(ctx), logger)
	defer func() {
		loops.stop()
		heartbeat.stop()
		leave(registry, p, logger)
		logger.Info("stopped")
	}()
	p.start(cfg, db, dsn, registry, loops.start, logger)
	// The heartbeat stamps swept_at after a cycle of this process's sweeper.
	registry.sweeps = p.retention.cycles.Load
	heartbeat.start("replicas", registry.Run)
	if demoRun != nil {
		if err := demoRun.setup(ctx); err != nil {
			return err
		}
		loops.start("demo", demoRun.Run)
	}

	a, err := newAdmin(ctx, cfg, db, box, p, demoRun, ln.Addr(), logger)
	if err != nil {
		return err
	}
	return serve(ctx, ln, newHTTPServer(routes(a), logger), cfg, readyLine(a), logger, stdout)
}

// registerReplica writes this process's row in outbox.replicas, before any
// claim: every job it claims records the id (replicas.go), and the row
// names the job kinds its workers run.
func registerReplica(ctx context.Context, db *sql.DB, cfg Config, kinds []string, logger *slog.Logger) (*replicaRegistry, error) {
	self := currentReplica(cfg.Workers.Concurrency, !cfg.DisableListen)
	self.Kinds = kinds
	registry := newReplicaRegistry(db, cfg.Replicas, self, logger)
	if err := registry.register(ctx); err != nil {
		return nil, err
	}
	logger.Info("registered as a replica", "replica", registry.ID(), "heartbeat", cfg.Replicas.Heartbeat, "dead_after", cfg.Replicas.DeadAfter)
	// A predecessor on this host that crashed is declared dead now, so
	// that the rescuer's first pass returns its jobs to the queue.
	if _, err := declareGoneProcessesDead(ctx, db, self, registry.ID(), logger); err != nil {
		logger.Warn("looking for this host's replicas whose process is gone failed; their jobs wait for their dead_after", "err", err)
	}
	return registry, nil
}

// loopGroup owns goroutines that run until its context ends: start runs
// one, stop cancels them all and waits for each.
type loopGroup struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	logger *slog.Logger
}

func newLoopGroup(parent context.Context, logger *slog.Logger) *loopGroup {
	ctx, cancel := context.WithCancel(parent)
	return &loopGroup{ctx: ctx, cancel: cancel, logger: logger}
}

// start runs loop in a goroutine of g; an error other than the end of
// g's context is logged with the loop's name.
func (g *loopGroup) start(name string, loop func(context.Context) error) {
	g.wg.Go(func() {
		if err := loop(g.ctx); err != nil && !errors.Is(err, context.Canceled) {
			g.logger.Error("loop stopped", "loop", name, "err", err)
		}
	})
}

// stop ends g's context and waits for every loop of g to return.
func (g *loopGroup) stop() {
	g.cancel()
	g.wg.Wait()
}

// newAdmin is what the HTTP side needs of the configuration, the database,
// the running pipeline and the address the listener bound. The sessions
// of any other admin token end here (keepSessionsOfToken).
func newAdmin(ctx context.Context, cfg Config, db *sql.DB, box *secretBox, p *pipeline, demoRun *demo, listening net.Addr, logger *slog.Logger) (*admin, error) {
	pnl, err := newPanel(logger)
	if err != nil {
		return nil, err
	}
	token, generated := adminToken(cfg)
	if err := keepSessionsOfToken(ctx, db, token, logger); err != nil {
		return nil, err
	}
	publicURL, _ := parsePublicURL(cfg.PublicURL) // validated
	if publicURL == nil && cfg.InsecureHTTP {
		logger.Warn("plain HTTP for a proxy in front, and no public URL: the session cookie is Secure, and HSTS sent, only where a trusted proxy says https; "+
			"set -public-url (OUTBOXD_PUBLIC_URL) to the https URL browsers use", "trusted_proxies", cfg.TrustedProxies.String())
	}
	counters := p.counters()
	counters.auth = newAuthMetrics()
	auth := newAuthLimiter(counters.auth, logger)
	alerts := cfg.Alerts
	alerts.AuthFailures = auth.recentFailures
	return &admin{
		db:              db,
		token:           token,
		tokenGenerated:  generated,
		alerts:          alerts,
		counters:        counters,
		panel:           pnl,
		eventsRetention: cfg.Retention.Events,
		maxAttempts:     cfg.Workers.MaxAttempts,
		demo:            demoRun,
		endpoints: endpointPolicy{
			AllowPrivate:   cfg.AllowPrivateEndpoints,
			RotationWindow: cfg.Webhooks.SecretRotationWindow,
			InboxWindow:    advertisedWindow(cfg.Retention.Inbox, cfg.Retention.Interval),
		},
		metricsPublic:  cfg.MetricsPublic,
		logger:         logger,
		box:            box,
		publicURL:      publicURL,
		listenURL:      url.URL{Scheme: httpScheme(cfg), Host: listening.String()},
		trustedProxies: cfg.TrustedProxies,
		auth:           auth,
		signinLinks:    cfg.SigninLinkLifetime,
	}, nil
}

// connect opens the database, first starting the embedded cluster when no
// URL is configured, and applies the schema. close releases both.
func connect(ctx context.Context, cfg Config, logger *slog.Logger) (db *sql.DB, dsn string, close func(), err error) {
	dsn = cfg.DatabaseURL
	stopCluster := func() {}
	if dsn == "" {
		cluster, err := startCluster(ctx, cfg.DataDir, logger)
		if err != nil {
			return nil, "", nil, err
		}
		stopCluster, dsn = cluster.Stop, cluster.DSN("outboxd")
	}
	db, err = openDBWaiting(ctx, dsn, cfg.DBMaxConns, cfg.DatabaseWait, logger)
	if err != nil && cfg.DatabaseURL != "" {
		err = fmt.Errorf("%s: %w", setting("database-url"), err)
	}
	if err == nil {
		switch {
		case cfg.PrintSQL: // prints what it would apply, and applies nothing
		case cfg.PoolMode == poolModeTransaction:
			err = requireMigrated(ctx, db, errMigrateThroughPooler)
		case !cfg.Migrate:
			err = requireMigrated(ctx, db, errMigrationsOff)
		default:
			err = migrateLogged(ctx, db, logger)
		}
		if err != nil {
			db.Close()
		}
	}
	if err != nil {
		stopCluster()
		return nil, "", nil, err
	}
	return db, dsn, func() { db.Close(); stopCluster() }, nil
}

// adminToken is the configured token, or a random one, generated, that
// the ready line shows in the panel's URL (readyLine), so a first run can
// sign in.
func adminToken(cfg Config) (token string, generated bool) {
	if cfg.AdminToken != "" {
		return cfg.AdminToken, false
	}
	return randomToken(), true
}

// readyLine is the last line of a start: outboxd is ready, and where a
// person opens its panel. With a token outboxd generated, the URL holds
// it, and opening the URL signs in (the token then leaves the address
// bar); with a configured one, the plain URL and the setting that holds
// the token to sign in with, which is never printed.
func readyLine(a *admin) string {
	u := a.panelBase()
	u.Path = "/"
	if !a.tokenGenerated {
		return fmt.Sprintf("outboxd ready: open the panel at %s and sign in with the admin token of %s", u.String(), setting("admin-token"))
	}
	u.RawQuery = url.Values{"token": {a.token}}.Encode()
	return fmt.Sprintf("outboxd ready: open the panel at %s (a token generated for this run; set %s to keep one across restarts)",
		u.String(), setting("admin-token"))
}

// leaveTimeout bounds the deregistration at shutdown.
const leaveTimeout = 5 * time.Second

// leave deletes this process's row on a clean shutdown, once its workers
// have stopped, and rescues at once any job it still held (an outcome its
// completer could not write), rather than leaving it to the horizon.
func leave(registry *replicaRegistry, p *pipeline, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if err := registry.deregister(ctx); err != nil {
		logger.Warn("leave the replica registry; other replicas will declare this one dead", "err", err)
		return
	}
	if _, err := p.rescuer.rescueDeadReplicas(ctx); err != nil {
		logger.Warn("rescue the jobs this replica still held", "err", err)
	}
}

// pipeline is the loops of one process, from LISTEN to retention. The HTTP
// side reads their counters.
type pipeline struct {
	wake       *wakeups
	relay      *relay
	workers    *workerPool
	feeder     *replayFeeder
	rescuer    *rescuer
	prober     *prober
	deliveries *deliveryMetrics
	notifier   *ownerNotifier
	retention  *sweeper
	registry   *replicaRegistry
}

// deliveryClients are the clients deliveries and recovery probes share:
// one for every endpoint, whose pool keeps connections alive per host and
// whose dialer refuses internal addresses (safehttp.go), and those of
// endpoints with TLS material of their own (clientcert.go).
func deliveryClients(cfg Config, db *sql.DB, box *secretBox, logger *slog.Logger) (*http.Client, *endpointClients) {
	opts := safeHTTPOptions{
		AllowPrivate: cfg.AllowPrivateEndpoints,
		Timeout:      cfg.Webhooks.Timeout,
		// An endpoint's own timeout may be longer (endpointrequest.go).
		LongestTimeout: maxEndpointTimeoutSeconds * time.Second,
		Concurrency:    cfg.Workers.Concurrency,
	}
	if cfg.EgressProxy != "" {
		opts.Proxy, _ = parseEgressProxy(cfg.EgressProxy) // validated at start
		logger.Info("deliveries go through an egress proxy", "proxy", opts.Proxy.Redacted())
	}
	client := newSafeHTTPClient(opts)
	return client, newEndpointClients(db, box, opts, client)
}

// newPipeline builds every loop in the order events move through them;
// none runs until start. With -demo (demoRun), the demo's own endpoint
// reaches its receiver on outboxd's listener whatever the address guard
// says, and no other endpoint does.
func newPipeline(cfg Config, db *sql.DB, box *secretBox, demoRun *demo, logger *slog.Logger) *pipeline {
	p := pipeline{wake: newWakeups()}
	subscribers := defaultSubscribers(cfg.Demo, logger)
	p.relay = newRelay(db, cfg.Relay, cfg.Workers.MaxAttempts, fanOutTargets(subscribers), logger)

	webhookClient, endpointTLS := deliveryClients(cfg, db, box, logger)
	p.deliveries = newDeliveryMetrics()
	mail := newMailer(cfg.Mail)
	logger.Info("mail settings", "smtp", mail, "from", cfg.Mail.From)
	webhooks := newWebhookSender(db, box, webhookClient, p.deliveries, mail, logger)
	webhooks.endpointTLS = endpointTLS
	if demoRun != nil {
		webhooks.exempt = demoRun.exemption(cfg.Webhooks.Timeout)
	}
	p.notifier = newOwnerNotifier(db, mail, cfg.Mail.OwnerNotifyPerHour, logger)
	p.workers = newWorkerPool(db, cfg.Workers, cfg.ShutdownGrace, subscribers, map[string]jobHandler{
		webhookJobKind:     webhooks.deliver,
		ownerNotifyJobKind: p.notifier.notify,
	}, logger)
	// Beside the workers, which drain the replay lanes it fills: where
	// there are no workers, nothing would come of its jobs.
	p.feeder = newReplayFeeder(db, cfg.Workers.MaxAttempts, logger)
	p.rescuer = newRescuer(db, cfg.Workers, cfg.Replicas, logger)
	p.prober = newProber(db, box, webhookClient, cfg.Retention.Events, cfg.Workers.MaxAttempts, logger)
	p.prober.endpointTLS = endpointTLS

	host, _ := os.Hostname()
	p.retention = newSweeper(db, cfg.Retention, fmt.Sprintf("%s:%d", host, os.Getpid()), logger)
	return &p
}

// start runs every loop of the pipeline with start, which owns its
// goroutine; the workers claim under registry's id.
func (p *pipeline) start(cfg Config, db *sql.DB, dsn string, registry *replicaRegistry, start func(string, func(context.Context) error), logger *slog.Logger) {
	p.registry = registry
	p.workers.replica = registry
	relayWake := p.wake.events
	switch {
	case cfg.PoolMode == poolModeTransaction:
		relayWake = nil // nothing wakes it: it sweeps (notify.go, poolModeTransaction)
	case !cfg.DisableListen:
		start("listener", newListener(dsn, p.wake, logger).Run)
		p.relay.notifyOrigin = p.wake.origin // the listener skips what the relay pokes
	}
	start("relay", func(ctx context.Context) error {
		if cfg.PoolMode == poolModeTransaction {
			quietProducers(ctx, db, logger)
		}
		return p.relay.Run(ctx, relayWake, p.wake.jobs)
	})
	start("workers", func(ctx context.Context) error { return p.workers.Run(ctx, p.wake.jobs) })
	start("replay feeder", p.feeder.Run)
	start("rescuer", p.rescuer.Run)
	start("prober", p.prober.Run)
	start("retention", p.retention.Run)
}

func (p *pipeline) counters() *processCounters {
	return &processCounters{
		relay:      p.relay,
		workers:    p.workers,
		rescuer:    p.rescuer,
		deliveries: p.deliveries,
		notifier:   p.notifier,
		retention:  p.retention,
		registry:   p.registry,
	}
}

// serve answers HTTP on ln, or HTTPS with cfg's certificate, until ctx
// ends or the server fails, then shuts it down, giving requests in flight
// up to cfg.ShutdownGrace. Once it accepts, it prints ready to stdout:
// the last line of a start, after everything the start logged.
func serve(ctx context.Context, ln net.Listener, srv *http.Server, cfg Config, ready string, logger *slog.Logger, stdout io.Writer) error {
	if cfg.TLSCert != "" {
		// Loaded here, not by ServeTLS in its goroutine, so a bad file
		// stops the start before it is announced.
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("%s, %s: %w", setting("tls-cert"), setting("tls-key"), err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	serveErr := make(chan error, 1)
	go func() {
		if cfg.TLSCert != "" {
			serveErr <- srv.ServeTLS(ln, "", "")
		} else {
			serveErr <- srv.Serve(ln)
		}
	}()
	logger.Info("outboxd started", "version", readBuildInfo().String(), "addr", ln.Addr().String(), "tls", cfg.TLSCert != "")
	// Ready once the schema is applied, the loops run and the listener
	// accepts: what a unit's dependents may rely on.
	if err := notifySystemd(cfg.NotifySocket, "READY=1"); err != nil {
		logger.Warn("tell systemd we are ready", "err", err)
	}
	fmt.Fprintln(stdout, ready)

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("http server: %w", err)
	}
	logger.Info("shutting down", "grace", cfg.ShutdownGrace)
	if err := notifySystemd(cfg.NotifySocket, "STOPPING=1"); err != nil {
		logger.Warn("tell systemd we are stopping", "err", err)
	}
	// A fresh context: ctx is already cancelled, and Shutdown given a
	// cancelled context returns at once without waiting for handlers.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if shutdownErr := srv.Shutdown(shutdownCtx); shutdownErr != nil && err == nil {
		err = fmt.Errorf("http shutdown: %w", shutdownErr)
	}
	return err
}

// httpScheme is how clients reach this process: https with a
// certificate, http without.
func httpScheme(cfg Config) string {
	if cfg.TLSCert != "" {
		return "https"
	}
	return "http"
}

// newHTTPServer is the server serve runs, with a bound on everything a
// client could otherwise hold open for ever; the tests build theirs with
// it, so they meet these very settings.
func newHTTPServer(handler http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler: handler,
		// A client trickling its headers (slow loris) holds a connection
		// no longer than this.
		ReadHeaderTimeout: 10 * time.Second,
		// The whole request, body included: the largest body there is
		// (maxRequestBody, 1 MiB) in 30 s is 35 KiB/s, slower than any
		// sender that means to deliver it, and a trickled body is cut.
		ReadTimeout: 30 * time.Second,
		// Counted from the end of the headers: every handler has ended by
		// requestTimeout (admin.go), and the rest is for writing its
		// answer, at most a few hundred KiB (/metrics, a page of
		// endpoints), to a client too slow to read it is cut.
		WriteTimeout: requestTimeout + 15*time.Second,
		// An idle kept-alive connection is closed after 2 minutes: longer
		// than the minute a load balancer in front commonly keeps one, so
		// that it is the balancer that closes it, never this end under a
		// request the balancer just sent; short enough that idle clients
		// do not pile up.
		IdleTimeout: 2 * time.Minute,
		// A bearer token, a session cookie and a webhook's signature
		// headers need a few KiB; the default would buffer 1 MiB a
		// request.
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// notifySystemd sends state ("READY=1", "STOPPING=1") to the service
// manager's socket, the sd_notify protocol: one datagram on a Unix socket
// whose path, or abstract name after '@', systemd gives in NOTIFY_SOCKET.
// Without a socket (not run by systemd, or not Type=notify) it does
// nothing.
func notifySystemd(socket, state string) error {
	if socket == "" {
		return nil
	}
	if strings.HasPrefix(socket, "@") {
		socket = "\x00" + socket[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	return nil
}

// defaultSubscribers is the registry run() starts with: every in-process
// subscriber outboxd ships. The idempotency test iterates exactly this, so
// a subscriber registered here is checked for one effect per event.
func defaultSubscribers(demo bool, logger *slog.Logger) *subscriberRegistry {
	subs := newSubscriberRegistry()
	if demo {
		subs.Register(logSubscriber(logger))
	}
	return subs
}

// fanOutTargets is every job kind the relay fans out to: the in-process
// subscribers and outboxd's own consumers of its own events.
func fanOutTargets(subs *subscriberRegistry) []jobTarget {
	return append(subs.targets(), ownerNotifyTarget)
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func randomToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}
