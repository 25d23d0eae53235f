// config.go: the generator's flags, read and checked in one place, with
// each scenario's own numbers for the flags the command line leaves unset.

package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
)

// config is the generator's flags.
type config struct {
	Outboxd     string // the outboxd binary under test
	DatabaseURL string // a database on the server the run uses
	Database    string // the database the run creates afresh beside it; "": DatabaseURL's own
	Mode        string // one of modes
	Producers   int
	Duration    time.Duration
	Rate        float64 // events/s over all producers; 0: as fast as the database commits
	Events      int     // drain; the queued or replayed events of some scenarios
	ServeFlags  string  // extra flags for the outboxd under test
	scenarioConfig
}

// scenarioConfig is the flags only some scenarios read.
type scenarioConfig struct {
	FailAfter    time.Duration // isolation, dead and stuck: the bad receiver's wait before its 500
	FailFor      time.Duration // stuck: how long the failing subject's requests are refused
	Subjects     int           // stuck and ordered: the subjects the events take in turn
	FailRatio    float64       // flaky: share of requests answered 500
	AcceptWithin time.Duration // flaky: every event's bound from commit to first 2xx
	RateLimit    float64       // ratelimit: the endpoint's rate_limit_per_second
	MaxInFlight  int           // the endpoint's max_in_flight (isolation: the bad one's); 0: outboxd's default (ordered: the child's workers)
	Rounds       int           // isolation, stuck, replay, ordered: baseline and scenario phases, alternating
	Replicas     int           // drain, ratelimit: outboxd processes against the database
	VacuumEvery  time.Duration // replay: how often the queue tables are vacuumed during the phases; 0: only before each
	AnswerAfter  time.Duration // replay: the receiver's wait before each 2xx, 0: at once; isolation: the bad receiver's, 0: it fails instead
	// Warmup: keepup runs its producers this long before -duration, and
	// meters the CPU time of -duration alone, per event delivered in it;
	// 0: the CPU time of the whole run, per event committed.
	Warmup time.Duration
	// DefaultEndpoint: drain and keepup register their endpoint with
	// outboxd's default delivery settings (its max_in_flight included),
	// as a new user would, instead of a cap of the child's workers.
	DefaultEndpoint bool
}

// defaultDatabaseURL is the server a run uses unless -database-url or
// DATABASE_URL names another: a local PostgreSQL, as `outboxd` documents.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// modes are -mode's values, in the order the usage text lists them.
var modes = []string{"drain", "keepup", "isolation", "flaky", "dead", "ratelimit", "stuck", "replay", "ordered", "producers"}

// modeHelp is one line a mode for the usage text.
var modeHelp = []string{
	"drain      record -events with outboxd stopped, start it, time their delivery",
	"keepup     -producers commit events for -duration while outboxd delivers",
	"isolation  a healthy endpoint alone, then beside one whose receiver hangs with a backlog",
	"flaky      a receiver that answers 500 to a share of requests (-fail-ratio)",
	"dead       a receiver that answers 500 to everything: the circuit breaker",
	"ratelimit  a rate-limited endpoint's backlog delivered by -replicas processes",
	"stuck      an ordered endpoint with one subject refused for -fail-for",
	"replay     live events alone and beside a replay of -events started through the API",
	"ordered    drains to one endpoint with ordering none and subject, in turn",
	"producers  outbox.record against a plain insert, with outboxd relaying, then stopped",
}

// databaseName is what -database accepts: a plain lowercase identifier,
// so that it is safe in CREATE and DROP DATABASE's text.
var databaseName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	cfg := config{DatabaseURL: cmp.Or(getenv("DATABASE_URL"), defaultDatabaseURL), Database: "outboxd_load",
		Mode: "keepup", Producers: 16, Duration: 60 * time.Second, Events: 100_000}
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(fs) }
	cfg.flags(fs)
	cfg.scenarioConfig.flags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.applyScenarioDefaults(set)
	if cfg.Mode == "drain" && !set["replicas"] {
		cfg.Replicas = 1
	}
	return cfg, errors.Join(cfg.validate(), cfg.scenarioConfig.validate())
}

// usage is -h: what the generator does, its modes, then every flag.
func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, "usage: load -outboxd PATH [-mode MODE] [flags]\n\n"+
		"Runs a built outboxd as a child process against a fresh database, records events through\n"+
		"outbox.record, receives and verifies its webhooks on loopback, and reports rates, latency\n"+
		"and outboxd's CPU time and memory (bench/load/README.md).\n\nModes (-mode):\n")
	for _, line := range modeHelp {
		fmt.Fprintf(w, "  %s\n", line)
	}
	fmt.Fprintf(w, "\nA former mode, jobs, timed no-op jobs inserted into outbox.jobs; outboxd has no such job kind.\n"+
		"`go test -run '^$' -bench Claim .` at the repository root measures the claim and the completer.\n\nFlags:\n")
	fs.PrintDefaults()
}

func (cfg *config) flags(fs *flag.FlagSet) {
	fs.StringVar(&cfg.Outboxd, "outboxd", cfg.Outboxd, "the outboxd binary under test (required; built by go build -o /tmp/outboxd . at the repository root)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "a database on the PostgreSQL server to run on (DATABASE_URL if set)")
	fs.StringVar(&cfg.Database, "database", cfg.Database, "the database the run creates on that server (dropped first if it exists, and at the end); empty: run in -database-url's own database, left as it is")
	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "what to measure: "+strings.Join(modes, ", ")+"; each scenario has its own defaults (bench/load/README.md)")
	fs.IntVar(&cfg.Producers, "producers", cfg.Producers, "producer connections, each committing single-event transactions")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the producers run (keepup; a scenario's phase: 30s; replay's phase without the replay: 60s)")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "events per second over all producers; 0 is as fast as possible (isolation and dead: 20, flaky and stuck: 50, replay's live events: 320)")
	fs.IntVar(&cfg.Events, "events", cfg.Events, "events recorded before delivery starts (drain); deliveries queued for the hanging endpoint (isolation) or the limited one (ratelimit): 1000; events replayed (replay): 100000; events of each drain (ordered): 20000")
	fs.StringVar(&cfg.ServeFlags, "serve-flags", cfg.ServeFlags, "extra flags for the outboxd under test, space-separated")
}

func (cfg config) validate() error {
	switch {
	case cfg.Outboxd == "":
		return errors.New("-outboxd: the outboxd binary is required (`go build -o /tmp/outboxd .` at the repository root)")
	case cfg.Mode == "jobs":
		return errors.New("-mode jobs is gone: outboxd has no no-op job kind; `go test -run '^$' -bench Claim .` at the repository root measures the claim and the completer")
	case !slices.Contains(modes, cfg.Mode):
		return fmt.Errorf("-mode must be one of %s, got %q", strings.Join(modes, ", "), cfg.Mode)
	case cfg.Database != "" && !databaseName.MatchString(cfg.Database):
		return fmt.Errorf("-database must be a lowercase name of letters, digits and _, got %q", cfg.Database)
	case cfg.Producers < 1 || cfg.Producers > 1000:
		return fmt.Errorf("-producers must be between 1 and 1000, got %d", cfg.Producers)
	case cfg.Events < 1:
		return fmt.Errorf("-events must be positive, got %d", cfg.Events)
	case cfg.Duration <= 0:
		return fmt.Errorf("-duration must be positive, got %s", cfg.Duration)
	}
	return nil
}

func (c *scenarioConfig) flags(fs *flag.FlagSet) {
	c.FailRatio, c.AcceptWithin, c.RateLimit, c.Replicas, c.Rounds = 0.1, 2*time.Minute, 20, 2, 1
	fs.DurationVar(&c.FailAfter, "fail-after", c.FailAfter, "how long the bad receiver waits before answering 500 (isolation: 5s, dead: 1s)")
	fs.Float64Var(&c.FailRatio, "fail-ratio", c.FailRatio, "share of requests the flaky receiver answers 500, at random")
	fs.DurationVar(&c.AcceptWithin, "accept-within", c.AcceptWithin, "flaky: the bound on every event's commit to first 2xx")
	fs.Float64Var(&c.RateLimit, "rate-limit", c.RateLimit, "ratelimit: the endpoint's rate_limit_per_second")
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "drain, ratelimit: outboxd processes delivering from the one database (drain: 1, ratelimit: 2)")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "isolation, stuck, replay, ordered, producers: rounds of a baseline phase and a phase with the scenario's trouble (stuck: 3, ordered: 2, producers: 2)")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", c.MaxInFlight, "isolation (the bad endpoint's), ratelimit, stuck, replay, ordered: the endpoint's max_in_flight; 0 leaves outboxd's default (ordered: the child's workers, as drain)")
	fs.DurationVar(&c.FailFor, "fail-for", c.FailFor, "stuck: how long the failing subject's requests are answered 500 (10s)")
	fs.IntVar(&c.Subjects, "subjects", c.Subjects, "stuck and ordered: distinct subjects the events take in turn (stuck: 100, ordered: 1000)")
	fs.DurationVar(&c.AnswerAfter, "answer-after", c.AnswerAfter, "replay: how long the receiver takes to answer each request 200, a stand-in for a receiver farther than loopback; 0: at once. isolation: the bad receiver accepts each request after it, slow rather than failing; 0: it answers 500 after -fail-after")
	fs.BoolVar(&c.DefaultEndpoint, "default-endpoint", c.DefaultEndpoint, "drain, keepup, producers: register the endpoint with outboxd's default delivery settings (max_in_flight 16), as a new user would, instead of max_in_flight set to the child's workers")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "keepup: the producers run this long first, then -duration, and the CPU time is metered over -duration alone, per event delivered in it (the line `CPU window`); 0: over the whole run, per event committed")
	fs.DurationVar(&c.VacuumEvery, "vacuum-every", c.VacuumEvery, "replay: vacuum the queue tables this often during the phases, a stand-in for autovacuum where it is off; 0: only before each phase")
}

func (c scenarioConfig) validate() error {
	switch {
	case c.FailAfter < 0:
		return fmt.Errorf("-fail-after must not be negative, got %s", c.FailAfter)
	case c.AnswerAfter < 0:
		return fmt.Errorf("-answer-after must not be negative, got %s", c.AnswerAfter)
	case !(c.FailRatio >= 0 && c.FailRatio <= 1):
		return fmt.Errorf("-fail-ratio must be between 0 and 1, got %g", c.FailRatio)
	case c.AcceptWithin <= 0:
		return fmt.Errorf("-accept-within must be positive, got %s", c.AcceptWithin)
	case !(c.RateLimit >= minRateLimit && c.RateLimit <= maxRateLimit):
		return fmt.Errorf("-rate-limit must be between %v and %v, got %g", minRateLimit, maxRateLimit, c.RateLimit)
	case c.Replicas < 1 || c.Replicas > 16:
		return fmt.Errorf("-replicas must be between 1 and 16, got %d", c.Replicas)
	case c.Rounds < 1 || c.Rounds > 100:
		return fmt.Errorf("-rounds must be between 1 and 100, got %d", c.Rounds)
	case c.MaxInFlight < 0 || c.MaxInFlight > maxMaxInFlight:
		return fmt.Errorf("-max-in-flight must be between 0 (outboxd's default) and %d, got %d", maxMaxInFlight, c.MaxInFlight)
	case c.Warmup < 0:
		return fmt.Errorf("-warmup must not be negative, got %s", c.Warmup)
	case c.VacuumEvery < 0:
		return fmt.Errorf("-vacuum-every must not be negative, got %s", c.VacuumEvery)
	case c.FailFor < 0:
		return fmt.Errorf("-fail-for must not be negative, got %s", c.FailFor)
	case c.Subjects < 0 || c.Subjects > 1_000_000:
		return fmt.Errorf("-subjects must be between 0 (each event a subject of its own) and 1000000, got %d", c.Subjects)
	}
	return nil
}

// replayLiveRate is replay's default live rate, events/s, kept so that
// runs compare across builds. The target's rate is half of what keepup
// commits on the machine: give it as -rate.
const replayLiveRate = 320

// scenarioDefault is a scenario's number for each flag it reads that the
// command line leaves unset.
type scenarioDefault struct {
	duration  time.Duration
	rate      float64
	events    int
	failAfter time.Duration
	failFor   time.Duration
	subjects  int
	rounds    int
}

// scenarioDefaults are the scenarios' own numbers; drain and keepup have
// none beyond the flags' defaults.
var scenarioDefaults = map[string]scenarioDefault{
	"isolation": {duration: 30 * time.Second, rate: 20, events: 1000, failAfter: 5 * time.Second},
	"flaky":     {duration: 30 * time.Second, rate: 50},
	"dead":      {duration: 30 * time.Second, rate: 20, failAfter: time.Second},
	"ratelimit": {duration: 30 * time.Second, events: 1000},
	"stuck":     {duration: 30 * time.Second, rate: 50, failFor: 10 * time.Second, subjects: 100, rounds: 3},
	"replay":    {duration: 60 * time.Second, rate: replayLiveRate, events: 100_000},
	"ordered":   {duration: 30 * time.Second, events: 20_000, subjects: 1000, rounds: 2},
	"producers": {duration: 15 * time.Second, rounds: 2},
}

// applyScenarioDefaults gives a scenario its own numbers for the flags
// the command line did not set (set holds the names it did).
func (cfg *config) applyScenarioDefaults(set map[string]bool) {
	d, ok := scenarioDefaults[cfg.Mode]
	if !ok {
		return
	}
	if !set["duration"] {
		cfg.Duration = d.duration
	}
	if !set["rate"] && d.rate > 0 {
		cfg.Rate = d.rate
	}
	if !set["events"] && d.events > 0 {
		cfg.Events = d.events
	}
	if !set["fail-after"] {
		cfg.FailAfter = d.failAfter
	}
	if !set["fail-for"] {
		cfg.FailFor = d.failFor
	}
	if !set["subjects"] {
		cfg.Subjects = d.subjects
	}
	if !set["rounds"] && d.rounds > 0 {
		cfg.Rounds = d.rounds
	}
}
