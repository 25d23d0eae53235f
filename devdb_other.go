//go:build !linux

// devdb_other.go: process attributes of the embedded cluster off Linux.

package main

import "syscall"

// serverProcAttr puts the server in its own process group, so the Ctrl-C
// that a terminal sends to outboxd's group does not stop the database under
// outboxd's graceful shutdown. Without Linux's parent-death signal, a server
// left by a crashed outboxd is reported at the next start.
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
