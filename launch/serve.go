package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

const (
	// hangupGrace is how long a command whose client went away has between SIGTERM and SIGKILL.
	hangupGrace = 5 * time.Second
	// handshakeTimeout bounds how long a connection may hold a goroutine before it has
	// authenticated.
	handshakeTimeout = 30 * time.Second
	// logCommandBytes is how much of a command a log line quotes: mpirun's are long.
	logCommandBytes = 300
)

var logger = log.New(os.Stderr, "", 0)

// logf writes one line for the person on call: time, level, peer ("-" for the server itself),
// what happened.
func logf(level, peer, format string, args ...any) {
	logger.Printf("%s %s %s %s", time.Now().UTC().Format(time.RFC3339), level, peer,
		fmt.Sprintf(format, args...))
}

type server struct {
	config   *ssh.ServerConfig
	reaper   *reaper
	refusals refusals
}

func serve(args []string) int {
	if len(args) > 0 {
		fmt.Fprint(os.Stderr, "usage: mpijob-launch serve\n")
		return 2
	}
	hostKey, authorized, err := serverKeys(keysDir())
	if err != nil {
		logf("ERROR", "-", "cannot start: %v", err)
		return 1
	}
	s := &server{config: serverConfig(hostKey, authorized), reaper: theReaper()}
	ln, err := net.Listen("tcp", ":"+port())
	if err != nil {
		logf("ERROR", "-", "cannot start: %v", err)
		return 1
	}
	logf("INFO", "-", "listening on %s (host key %s, accepting launcher key %s)", ln.Addr(),
		ssh.FingerprintSHA256(hostKey.PublicKey()), ssh.FingerprintSHA256(authorized))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-stop
		logf("INFO", "-", "%v: no new connections, terminating running commands", sig)
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			break
		}
		if err != nil { // out of file descriptors, say: wait rather than spin
			logf("ERROR", "-", "accept: %v", err)
			time.Sleep(time.Second)
			continue
		}
		go s.handle(conn)
	}
	s.reaper.stopAll(hangupGrace)
	logf("INFO", "-", "stopped")
	return 0
}

// serverConfig is the worker's side: public-key authentication with the launcher's key only,
// whatever the user name (the pod's user runs everything).
func serverConfig(hostKey ssh.Signer, authorized ssh.PublicKey) *ssh.ServerConfig {
	config := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if bytes.Equal(key.Marshal(), authorized.Marshal()) {
				return &ssh.Permissions{}, nil
			}
			return nil, fmt.Errorf("key %s is not the job's launcher key", ssh.FingerprintSHA256(key))
		},
		ServerVersion: "SSH-2.0-mpijob-launch",
	}
	config.AddHostKey(hostKey)
	return config
}

// countingConn counts what the peer sent: a connection that closes before its first byte is a
// readiness probe and not worth a log line.
type countingConn struct {
	net.Conn
	read atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (s *server) handle(nc net.Conn) {
	defer nc.Close()
	peer := nc.RemoteAddr().String()
	counted := &countingConn{Conn: nc}
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	conn, chans, reqs, err := ssh.NewServerConn(counted, s.config)
	if err != nil {
		if counted.read.Load() > 0 {
			s.refusals.log(peer, err)
		}
		return
	}
	_ = nc.SetDeadline(time.Time{})
	logf("INFO", peer, "accepted: user %q, launcher key", conn.User())
	go ssh.DiscardRequests(reqs) // port forwarding and the like: refused
	for newChannel := range chans {
		if newChannel.ChannelType() != "session" {
			logf("WARN", peer, "refused a %q channel: only sessions", newChannel.ChannelType())
			_ = newChannel.Reject(ssh.Prohibited, "only sessions")
			continue
		}
		go s.session(peer, newChannel)
	}
	logf("INFO", peer, "connection closed")
}

// session serves one channel: one exec, its signals, nothing else. When the channel goes
// before the command ended (the launcher was killed, the connection dropped), the command's
// group is terminated: nothing a launcher started outlives it.
func (s *server) session(peer string, newChannel ssh.NewChannel) {
	ch, reqs, err := newChannel.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	var cmd *command
	for req := range reqs {
		switch req.Type {
		case "exec":
			var payload struct{ Command string }
			if cmd != nil || ssh.Unmarshal(req.Payload, &payload) != nil {
				_ = req.Reply(false, nil)
				continue
			}
			if cmd, err = s.start(payload.Command); err != nil {
				logf("ERROR", peer, "cannot start %s: %v", quoteCommand(payload.Command), err)
				_ = req.Reply(false, nil)
				return
			}
			logf("INFO", peer, "started pid %d: %s", cmd.pid, quoteCommand(payload.Command))
			// The reply goes before any output or exit status: the client waits for it.
			_ = req.Reply(true, nil)
			go cmd.run(peer, ch)
		case "signal":
			var payload struct{ Signal string }
			if cmd != nil && ssh.Unmarshal(req.Payload, &payload) == nil {
				if sig := unix.SignalNum("SIG" + payload.Signal); sig != 0 {
					s.reaper.signal(cmd.pid, sig)
				}
			}
			if req.WantReply {
				_ = req.Reply(cmd != nil, nil)
			}
		case "env": // OpenSSH's client sends LANG and LC_* unasked: refused, not worth a line
			_ = req.Reply(false, nil)
		default: // shell, pty-req, subsystem, x11-req, agent forwarding: not offered
			logf("WARN", peer, "refused a %q request: only exec and signal", req.Type)
			_ = req.Reply(false, nil)
		}
	}
	if cmd != nil {
		cmd.hangup(peer)
	}
}

// command is one exec: its process group and the server's ends of its stdio pipes.
type command struct {
	reaper                *reaper
	pid                   int
	exited                <-chan syscall.WaitStatus
	stdin, stdout, stderr *os.File
}

func (s *server) start(line string) (*command, error) {
	var child [3]*os.File // the command's stdin, stdout, stderr
	c := &command{reaper: s.reaper}
	var err error
	if child[0], c.stdin, err = os.Pipe(); err != nil {
		return nil, err
	}
	if c.stdout, child[1], err = os.Pipe(); err != nil {
		closeAll(child[0], c.stdin)
		return nil, err
	}
	if c.stderr, child[2], err = os.Pipe(); err != nil {
		closeAll(child[0], c.stdin, c.stdout, child[1])
		return nil, err
	}
	// The command holds its ends now; ours are closed so its exit shows as EOF here.
	defer closeAll(child[:]...)
	c.pid, c.exited, err = s.reaper.start([]string{"/bin/sh", "-c", line}, child[:])
	if err != nil {
		closeAll(c.stdin, c.stdout, c.stderr)
		return nil, err
	}
	return c, nil
}

// run forwards the command's stdio over the channel and, once it exited and its output is all
// sent, its exit status; then closes the channel.
func (c *command) run(peer string, ch ssh.Channel) {
	go func() {
		_, _ = io.Copy(c.stdin, ch)
		c.stdin.Close() // the client's EOF is the command's
	}()
	var output sync.WaitGroup
	for _, f := range []struct {
		dst io.Writer
		src *os.File
	}{{ch, c.stdout}, {ch.Stderr(), c.stderr}} {
		output.Go(func() {
			_, _ = io.Copy(f.dst, f.src)
			f.src.Close() // a writer to a gone channel gets EPIPE instead of blocking
		})
	}
	status := <-c.exited
	c.stdin.Close()
	// Like sshd, the channel stays open until the output pipes close, also if a process the
	// command left in the background holds them.
	output.Wait()
	switch {
	case status.Signaled():
		name := unix.SignalName(status.Signal())
		if len(name) > 3 {
			name = name[3:] // SSH names signals without "SIG"
		}
		logf("INFO", peer, "pid %d killed by signal %s", c.pid, name)
		_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(&struct {
			Signal     string
			CoreDumped bool
			Error      string
			Lang       string
		}{Signal: name, CoreDumped: status.CoreDump()}))
	default:
		logf("INFO", peer, "pid %d exited with status %d", c.pid, status.ExitStatus())
		_, _ = ch.SendRequest("exit-status", false,
			ssh.Marshal(&struct{ Status uint32 }{uint32(status.ExitStatus())}))
	}
	ch.Close()
}

// hangup ends what the channel's client left running: SIGTERM to its group, SIGKILL after
// hangupGrace if its first process is still there. A command that already exited is left alone.
func (c *command) hangup(peer string) {
	if c.reaper.signal(c.pid, syscall.SIGTERM) {
		logf("WARN", peer, "client gone before pid %d ended: terminating its process group", c.pid)
		time.AfterFunc(hangupGrace, func() {
			if c.reaper.signal(c.pid, syscall.SIGKILL) {
				logf("WARN", peer, "pid %d still running %s after SIGTERM: killed", c.pid, hangupGrace)
			}
		})
	}
	closeAll(c.stdout, c.stderr)
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

func quoteCommand(line string) string {
	if len(line) > logCommandBytes {
		return fmt.Sprintf("%q... (%d bytes)", line[:logCommandBytes], len(line))
	}
	return fmt.Sprintf("%q", line)
}

// refusals keeps refused connections from flooding the log: at most one line per peer host a
// second, the next line counting those left out.
type refusals struct {
	mu      sync.Mutex
	last    map[string]time.Time
	skipped map[string]int
}

func (r *refusals) log(peer string, err error) {
	host, _, splitErr := net.SplitHostPort(peer)
	if splitErr != nil {
		host = peer
	}
	r.mu.Lock()
	if r.last == nil || len(r.last) > 4096 { // many peers: forget them rather than grow
		r.last, r.skipped = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if now.Sub(r.last[host]) < time.Second {
		r.skipped[host]++
		r.mu.Unlock()
		return
	}
	skipped := r.skipped[host]
	r.last[host] = now
	delete(r.skipped, host)
	r.mu.Unlock()
	more := ""
	if skipped > 0 {
		more = fmt.Sprintf(" (and %d more refused from %s since the last line)", skipped, host)
	}
	logf("WARN", peer, "refused: %s%s", refusalReason(err), more)
}

// refusalReason is why the handshake failed in words: the offered key's fingerprint when it
// was not the launcher's, a hint when the client hung up.
func refusalReason(err error) string {
	var authErr *ssh.ServerAuthError
	if errors.As(err, &authErr) {
		var reasons []string
		for _, e := range authErr.Errors {
			if !errors.Is(e, ssh.ErrNoAuth) {
				reasons = append(reasons, e.Error())
			}
		}
		if len(reasons) == 0 {
			return "no public key offered"
		}
		return fmt.Sprintf("%v", reasons)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
		// What a client does that does not trust this host key, or is no SSH client at all.
		return "the client hung up during the handshake: " + err.Error()
	}
	return "handshake failed: " + err.Error()
}
