package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"testing"

	"golang.org/x/crypto/ssh"
)

// startServer serves one job's worker on a port of 127.0.0.1 from this process; a client of
// that job's launcher, connected.
func startServer(t *testing.T) *ssh.Client {
	t.Helper()
	hostKey, launcherKey := newSigner(t), newSigner(t)
	s := &server{config: serverConfig(hostKey, launcherKey.PublicKey()), reaper: theReaper()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go s.handle(conn)
		}
	}()
	client, err := ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{
		User:            "anyone",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(launcherKey)},
		HostKeyCallback: ssh.FixedHostKey(hostKey.PublicKey()),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func newSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

func TestOnlyExecIsOffered(t *testing.T) {
	client := startServer(t)
	session, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	if err := session.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err == nil {
		t.Error("a terminal was granted")
	}
	if err := session.Shell(); err == nil {
		t.Error("a shell was granted")
	}
	if err := session.RequestSubsystem("sftp"); err == nil {
		t.Error("a subsystem was granted")
	}
	if _, err := client.Dial("tcp", "127.0.0.1:1"); err == nil {
		t.Error("a forwarded connection was opened")
	}
	if _, err := client.Listen("tcp", "127.0.0.1:0"); err == nil {
		t.Error("a remote port forward was granted")
	}
	// After all that refused, the session still runs a command.
	out, err := session.Output("echo ok")
	if err != nil || string(out) != "ok\n" {
		t.Errorf("exec after refusals: %q, %v", out, err)
	}
}

func TestSignalsReachTheCommand(t *testing.T) {
	client := startServer(t)
	session, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := session.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := session.Start("echo ready; sleep 100"); err != nil {
		t.Fatal(err)
	}
	if _, err := stdout.Read(make([]byte, 6)); err != nil { // the command is running
		t.Fatal(err)
	}
	if err := session.Signal(ssh.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var exit *ssh.ExitError
	if err := session.Wait(); !errors.As(err, &exit) || exit.Signal() != "TERM" {
		t.Errorf("Wait() = %v; want the command killed by TERM", err)
	}
}
