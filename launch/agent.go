package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

const (
	// ssh's options, by whether they take an argument (OpenSSH 9's ssh(1)). mpirun passes some
	// (-x, -q, -o ...); none means anything here: the job's keys and port are fixed.
	optionsWithoutArg = "46AaCfGgKkMNnqsTtVvXxYy"
	optionsWithArg    = "BbcDEeFIiJLlmOopQRSWw"
	// A worker pod that is just starting has no DNS name yet, or nothing listening: try again,
	// for about as long as such a pod takes.
	dialAttempts = 10
	dialPause    = time.Second
	dialTimeout  = 5 * time.Second
	// agentFailed is ssh's status when it could not run the command.
	agentFailed = 255
)

// destination is what an ssh command line asks for.
type destination struct {
	user, host string
	command    string // the words after the host joined by single spaces, as ssh sends them
}

// parseArgs reads `[options] [user@]HOST [options] COMMAND...` as OpenSSH does: options in
// groups (-qx, -oX, -o X), also after the host until the first other word.
func parseArgs(args []string) (destination, error) {
	var d destination
	host := ""
	i := 0
	for ; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			i++
			if host == "" && i < len(args) {
				host = args[i]
				i++
			}
			break
		}
		if len(arg) < 2 || arg[0] != '-' {
			if host != "" {
				break
			}
			host = arg
			continue
		}
		for j := 1; j < len(arg); j++ {
			switch c := arg[j]; {
			case strings.IndexByte(optionsWithoutArg, c) >= 0:
			case strings.IndexByte(optionsWithArg, c) >= 0:
				if j == len(arg)-1 { // the argument is the next word
					if i++; i == len(args) {
						return d, fmt.Errorf("option -%c needs an argument", c)
					}
				}
				j = len(arg)
			default:
				return d, fmt.Errorf("unknown option -%c", c)
			}
		}
	}
	if host == "" {
		return d, errors.New("no host given")
	}
	if at := strings.LastIndexByte(host, '@'); at >= 0 {
		d.user, host = host[:at], host[at+1:]
	}
	if host == "" {
		return d, errors.New("no host given")
	}
	d.host = host
	d.command = strings.Join(args[i:], " ")
	return d, nil
}

// agent runs one command on a worker as `ssh` would and exits with its status.
func agent(args []string) int {
	d, err := parseArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpijob-launch: %v\n"+
			"usage: mpijob-launch [ssh options] [user@]HOST COMMAND... (--help)\n", err)
		return agentFailed
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "mpijob-launch: %s: %s\n", d.host, fmt.Sprintf(format, args...))
		return agentFailed
	}
	if d.command == "" {
		return fail("no command: mpijob-launch runs commands and offers no shell")
	}
	config, err := clientConfig(d.user)
	if err != nil {
		return fail("%v", err)
	}

	// A signal closes the connection, which is how the server learns to end the command: the
	// launcher's mpirun is going away and nothing it started may stay.
	var mu sync.Mutex
	var conn net.Conn
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		sig := <-signals
		mu.Lock()
		if conn != nil {
			conn.Close()
		}
		os.Exit(fail("%v: connection closed, the remote command ends", sig))
	}()

	addr := net.JoinHostPort(d.host, port())
	c, err := dial(addr)
	if err != nil {
		return fail("%v", err)
	}
	mu.Lock()
	conn = c
	mu.Unlock()
	client, err := handshake(c, addr, config)
	if err != nil { // never retried: a refused key stays refused
		return fail("%v", err)
	}
	status, why := run(client, d.command)
	if why != "" {
		return fail("%s", why)
	}
	return status
}

// clientConfig is the launcher's side: its key, and the workers' key as the only host key.
func clientConfig(user string) (*ssh.ClientConfig, error) {
	key, hostKey, err := clientKeys(keysDir())
	if err != nil {
		return nil, err
	}
	if user == "" {
		user = os.Getenv("USER")
	}
	if user == "" {
		user = "mpijob" // the server takes any name
	}
	return &ssh.ClientConfig{
		User:            user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(hostKey),
		ClientVersion:   "SSH-2.0-mpijob-launch",
	}, nil
}

func handshake(c net.Conn, addr string, config *ssh.ClientConfig) (*ssh.Client, error) {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	sshConn, chans, reqs, err := ssh.NewClientConn(c, addr, config)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return ssh.NewClient(sshConn, chans, reqs), nil
}

// run runs command in a session with this process's stdio: the command's exit status, or why
// there is none.
func run(client *ssh.Client, command string) (int, string) {
	session, err := client.NewSession()
	if err != nil {
		return agentFailed, err.Error()
	}
	session.Stdout, session.Stderr = os.Stdout, os.Stderr
	// Stdin is copied here rather than by the session, whose Wait would report a command that
	// exits before reading all its input (`head -c 10`) as a failed write: ssh gives its status.
	stdin, err := session.StdinPipe()
	if err != nil {
		return agentFailed, err.Error()
	}
	go func() {
		_, _ = io.Copy(stdin, os.Stdin)
		stdin.Close() // the remote command's EOF
	}()
	err = session.Run(command)
	var exit *ssh.ExitError
	switch {
	case err == nil:
		return 0, ""
	case errors.As(err, &exit) && exit.Signal() != "":
		return agentFailed, "remote command killed by signal " + exit.Signal()
	case errors.As(err, &exit):
		return exit.ExitStatus(), ""
	case errors.As(err, new(*ssh.ExitMissingError)):
		return agentFailed, "connection lost before the command ended"
	default:
		return agentFailed, err.Error()
	}
}

// dial connects to addr, trying again on any error: a name not resolvable yet, nothing
// listening yet.
func dial(addr string) (net.Conn, error) {
	// Go's dialer turns TCP keepalive on (15 s): a worker that vanishes without closing the
	// connection (its node gone) ends the wait too, not only one that closes it.
	dialer := net.Dialer{Timeout: dialTimeout}
	var err error
	for attempt := 1; ; attempt++ {
		var conn net.Conn
		if conn, err = dialer.Dial("tcp", addr); err == nil {
			return conn, nil
		}
		if attempt == dialAttempts {
			return nil, fmt.Errorf("%w (%d attempts)", err, dialAttempts)
		}
		time.Sleep(dialPause)
	}
}
