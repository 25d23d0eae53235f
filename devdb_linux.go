// devdb_linux.go: process attributes of the embedded cluster on Linux.

package main

import "syscall"

// serverProcAttr puts the server in its own process group, so the Ctrl-C
// that a terminal sends to outboxd's group does not stop the database under
// outboxd's graceful shutdown, and asks the kernel to send it the fast
// shutdown signal if outboxd dies without stopping it, so no orphan server
// holds the data folder.
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT, Credential: cred}
}
