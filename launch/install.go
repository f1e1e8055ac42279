package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// install copies this binary into DIR, the pod's shared emptyDir, from the operator's image.
func install(args []string) int {
	if len(args) != 1 {
		fmt.Fprint(os.Stderr, "usage: mpijob-launch install DIR\n")
		return 2
	}
	dest, err := installInto(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpijob-launch: install: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "mpijob-launch: installed %s\n", dest)
	return 0
}

// installInto writes a temporary file in dir and renames it into place, so a container that
// starts while an init container is retried never runs half a binary.
func installInto(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil && strings.Contains(os.Args[0], "/") {
		self, err = os.Args[0], nil // no /proc (a chroot, say): the path it was started by
	}
	if err != nil {
		return "", err
	}
	src, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, "."+binaryName+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	dest := filepath.Join(dir, binaryName)
	return dest, os.Rename(tmp.Name(), dest)
}
