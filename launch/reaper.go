package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// reaper starts the server's commands and is the only caller of wait: as a container's first
// process the server inherits every orphan of the pod's processes and must reap them, and a
// reaper racing os/exec's per-command Wait would now and then take a command's exit status
// from it. Here one loop reaps every child and hands each status to whoever started that pid;
// an unknown pid (an orphan) is just reaped.
type reaper struct {
	// mu is held across fork and registration, and across every wait: a command that exits at
	// once is reaped only after its pid is registered, and a pid is signalled only while it is
	// still unreaped, so never after the kernel may have given the number to another process.
	mu      sync.Mutex
	running map[int]chan<- syscall.WaitStatus
	sigchld chan os.Signal
}

// theReaper is the process's one reaper: two would take each other's children.
var theReaper = sync.OnceValue(newReaper)

func newReaper() *reaper {
	r := &reaper{running: map[int]chan<- syscall.WaitStatus{}, sigchld: make(chan os.Signal, 1)}
	// Before the first fork, so no child's exit goes unnoticed; one pending signal stands for
	// any number of exits, which reap collects together.
	signal.Notify(r.sigchld, syscall.SIGCHLD)
	go func() {
		for range r.sigchld {
			r.reap()
		}
	}()
	return r
}

// start runs argv in a process group of its own (so a signal reaches everything the command
// started) with files as its stdin, stdout and stderr, the server's environment and working
// directory; the channel receives its wait status once.
func (r *reaper) start(argv []string, files []*os.File) (int, <-chan syscall.WaitStatus, error) {
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = f.Fd()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: fds,
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return 0, nil, err
	}
	exited := make(chan syscall.WaitStatus, 1)
	r.running[pid] = exited
	return pid, exited, nil
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 { // no child left, or none exited yet
			return
		}
		if exited, ok := r.running[pid]; ok {
			delete(r.running, pid)
			exited <- status
		}
	}
}

// signal sends sig to the process group led by pid if pid has not been reaped yet; whether it
// was sent.
func (r *reaper) signal(pid int, sig syscall.Signal) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.running[pid]; !ok {
		return false
	}
	return syscall.Kill(-pid, sig) == nil
}

func (r *reaper) signalAll(sig syscall.Signal) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for pid := range r.running {
		_ = syscall.Kill(-pid, sig)
	}
	return len(r.running)
}

// stopAll terminates every running command's group, and kills those still running after grace.
func (r *reaper) stopAll(grace time.Duration) {
	if r.signalAll(syscall.SIGTERM) == 0 {
		return
	}
	for deadline := time.Now().Add(grace); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		r.mu.Lock()
		left := len(r.running)
		r.mu.Unlock()
		if left == 0 {
			return
		}
	}
	r.signalAll(syscall.SIGKILL)
}
