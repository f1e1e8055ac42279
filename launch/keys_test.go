package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// newKey writes a fresh Ed25519 pair as the operator's Secret holds it: the private key in
// OpenSSH's format, the public one as an authorized_keys line.
func newKey(t *testing.T) (private, public []byte) {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block), ssh.MarshalAuthorizedKey(pub)
}

func write(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestServerAndClientKeysLoad(t *testing.T) {
	launcherKey, launcherPub := newKey(t)
	workerKey, workerPub := newKey(t)
	server, client := t.TempDir(), t.TempDir()
	write(t, server, hostKeyFile, workerKey)
	write(t, server, authorizedKeyFile, launcherPub)
	write(t, client, clientKeyFile, launcherKey)
	write(t, client, knownHostKeyFile, workerPub)

	host, authorized, err := serverKeys(server)
	if err != nil {
		t.Fatal(err)
	}
	own, knownHost, err := clientKeys(client)
	if err != nil {
		t.Fatal(err)
	}
	// Each side's public key is the other's private one.
	if !bytes.Equal(host.PublicKey().Marshal(), knownHost.Marshal()) {
		t.Error("the worker's host key is not the launcher's known host key")
	}
	if !bytes.Equal(own.PublicKey().Marshal(), authorized.Marshal()) {
		t.Error("the launcher's key is not the worker's authorized key")
	}
	if host.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Errorf("host key type %s", host.PublicKey().Type())
	}
}

func TestKeyFilesThatAreNotOneKeyAreRefused(t *testing.T) {
	private, public := newKey(t)
	_, other := newKey(t)
	dir := t.TempDir()
	for name, data := range map[string][]byte{
		"empty":       nil,
		"garbage":     []byte("not a key\n"),
		"public":      public,
		"two-keys":    append(append([]byte{}, public...), other...),
		"private-key": private,
	} {
		write(t, dir, name, data)
	}
	for _, name := range []string{"empty", "garbage", "public"} {
		if _, err := loadPrivateKey(filepath.Join(dir, name)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("loadPrivateKey(%s): %v; want an error naming the file", name, err)
		}
	}
	for _, name := range []string{"empty", "garbage", "two-keys", "private-key"} {
		if _, err := loadPublicKey(filepath.Join(dir, name)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("loadPublicKey(%s): %v; want an error naming the file", name, err)
		}
	}
	// A comment line after the one key is no second key.
	write(t, dir, "commented", append(append([]byte{}, public...), "# the launcher's\n"...))
	if _, err := loadPublicKey(filepath.Join(dir, "commented")); err != nil {
		t.Error(err)
	}
	if _, _, err := serverKeys(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), hostKeyFile) {
		t.Errorf("serverKeys of a missing folder: %v; want an error naming %s", err, hostKeyFile)
	}
}
