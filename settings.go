// settings.go: how messages name a setting, shared by main.go, which
// parses them, and the stages that check their own settings or find one
// missing at run time. It uses nothing of any other file, so every file
// may use it.

package main

import (
	"fmt"
	"strings"
	"time"
)

// envName is the environment fallback of a flag: DATABASE_URL for
// -database-url, OUTBOXD_RELAY_BATCH for -relay-batch.
func envName(flagName string) string {
	if flagName == "database-url" {
		return "DATABASE_URL"
	}
	return "OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// setting names a flag and its environment variable, for messages, so
// that an operator finds it whichever way they configure outboxd.
func setting(name string) string { return fmt.Sprintf("-%s (%s)", name, envName(name)) }

// maxRetention bounds every retention window, configured or advertised by
// a receiver: ten years is "keep", and a larger value is a typo.
const maxRetention = 10 * 365 * 24 * time.Hour
