// Command mpijob-launch lets mpirun start an MPIJob's processes on its workers without ssh or
// sshd in the job's images: `serve` is the workers' server, any other use is the client mpirun
// calls as it would call ssh. Both speak the SSH protocol (golang.org/x/crypto/ssh), which
// authenticates both ends with the job's own keys and makes a captured connection worthless to
// replay. The operator's side of the contract (paths, key files, port) is
// operator/mpijob/desired/launch.py; docs/launch.md has the threat model.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
)

const (
	// defaultKeysDir is launch.py's KEYS_DIR, where the pods mount the job's keys.
	defaultKeysDir = "/mpijob/launch/keys"
	// defaultPort is launch.py's PORT: above 1023, so the server binds it with no capability.
	defaultPort = "2222"
	// The key files in the keys folder, per role (launch.py's *_FILE names).
	hostKeyFile       = "host-key"
	authorizedKeyFile = "authorized-key"
	clientKeyFile     = "client-key"
	knownHostKeyFile  = "known-host-key"
	// binaryName is what `install` writes into its folder (launch.py's BINARY).
	binaryName = "mpijob-launch"
)

const usage = `mpijob-launch: start an MPI job's processes on its workers, without sshd.

  mpijob-launch [ssh options] [user@]HOST COMMAND...
      Run COMMAND on HOST as ssh would (mpirun's remote agent). ssh's options are accepted and
      ignored; stdin, stdout and stderr are forwarded; the exit status is COMMAND's, or 255
      when the connection fails, is refused or is lost. Keys: $KEYS/client-key and
      $KEYS/known-host-key, the only host key accepted.
  mpijob-launch serve
      The worker's server: runs what the holder of $KEYS/authorized-key asks, proves itself
      with $KEYS/host-key.
  mpijob-launch install DIR
      Copy this binary to DIR/mpijob-launch (an init container's job).
  mpijob-launch version | --help

Environment: MPIJOB_LAUNCH_KEYS (KEYS, default /mpijob/launch/keys), MPIJOB_LAUNCH_PORT
(default 2222).
`

func main() {
	args := os.Args[1:]
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			os.Exit(serve(args[1:]))
		case "install":
			os.Exit(install(args[1:]))
		case "version", "--version", "--help", "-h", "help":
			printUsage(os.Stdout)
			os.Exit(0)
		}
	}
	os.Exit(agent(args))
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, usage)
	fmt.Fprintf(w, "\n%s\n", buildVersion())
}

// buildVersion names the Go release and the SSH library the binary was built with: what
// decides its protocol and its fixes.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "mpijob-launch (build information missing)"
	}
	parts := []string{info.GoVersion}
	for _, dep := range info.Deps {
		if dep.Path == "golang.org/x/crypto" {
			parts = append(parts, dep.Path+" "+dep.Version)
		}
	}
	return "mpijob-launch (" + strings.Join(parts, ", ") + ")"
}

func keysDir() string {
	if dir := os.Getenv("MPIJOB_LAUNCH_KEYS"); dir != "" {
		return dir
	}
	return defaultKeysDir
}

func port() string {
	if p := os.Getenv("MPIJOB_LAUNCH_PORT"); p != "" {
		return p
	}
	return defaultPort
}
