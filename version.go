// version.go: the version of this build, at the bottom of every stage that
// reports it.

package main

// version is reported in the User-Agent of outgoing webhooks and in logs.
const version = "0.1.0"
