package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
)

// loadPrivateKey reads an unencrypted private key in OpenSSH's format (the Secret's
// launcher-key or worker-key).
func loadPrivateKey(path string) (ssh.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: not a private key: %w", path, err)
	}
	return signer, nil
}

// loadPublicKey reads the one `ssh-ed25519 AAAA...` line of a public-key file. A file with a
// second key is refused rather than half-read: whoever wrote it meant something else.
func loadPublicKey(path string) (ssh.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, _, _, rest, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: no public key (one `ssh-ed25519 AAAA...` line): %w", path, err)
	}
	if _, _, _, _, err := ssh.ParseAuthorizedKey(rest); err == nil {
		return nil, fmt.Errorf("%s: more than one public key", path)
	}
	return key, nil
}

// serverKeys are what a worker holds: its own host key and the launcher's public key.
func serverKeys(dir string) (host ssh.Signer, authorized ssh.PublicKey, err error) {
	if host, err = loadPrivateKey(filepath.Join(dir, hostKeyFile)); err != nil {
		return nil, nil, err
	}
	if authorized, err = loadPublicKey(filepath.Join(dir, authorizedKeyFile)); err != nil {
		return nil, nil, err
	}
	return host, authorized, nil
}

// clientKeys are what the launcher holds: its own key and the workers' public key.
func clientKeys(dir string) (client ssh.Signer, knownHost ssh.PublicKey, err error) {
	if client, err = loadPrivateKey(filepath.Join(dir, clientKeyFile)); err != nil {
		return nil, nil, err
	}
	if knownHost, err = loadPublicKey(filepath.Join(dir, knownHostKeyFile)); err != nil {
		return nil, nil, err
	}
	return client, knownHost, nil
}
