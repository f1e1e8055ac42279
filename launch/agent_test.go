package main

import "testing"

func TestParseArgsSkipsSSHOptions(t *testing.T) {
	cases := []struct {
		args []string
		want destination
	}{
		{[]string{"host", "echo", "a", "b"}, destination{host: "host", command: "echo a b"}},
		{
			[]string{"-x", "-q", "-o", "ConnectionAttempts=10", "-p", "22", "user@127.0.0.1", "echo", "a", "b"},
			destination{user: "user", host: "127.0.0.1", command: "echo a b"},
		},
		// Combined flags, an option's argument in the same word, the last flag of a group taking
		// the next word.
		{[]string{"-qxT", "-oStrictHostKeyChecking=no", "-qp", "22", "h", "true"}, destination{host: "h", command: "true"}},
		// Options after the host, as OpenSSH reads them, up to the first other word.
		{[]string{"h", "-x", "-l", "u", "cmd", "-x"}, destination{host: "h", command: "cmd -x"}},
		{[]string{"-x", "--", "h", "-c", "x"}, destination{host: "h", command: "-c x"}},
		{[]string{"a@b@h", "ls"}, destination{user: "a@b", host: "h", command: "ls"}},
		{[]string{"h"}, destination{host: "h"}},
		// Words are joined as they are: quoting is the remote shell's business, as with ssh.
		{[]string{"h", "echo", "'a  b'", ""}, destination{host: "h", command: "echo 'a  b' "}},
	}
	for _, c := range cases {
		got, err := parseArgs(c.args)
		if err != nil || got != c.want {
			t.Errorf("parseArgs(%q) = %+v, %v; want %+v", c.args, got, err, c.want)
		}
	}
}

func TestParseArgsRefusesWhatSSHRefuses(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-x"},
		{"-o"},           // an option without its argument
		{"-x", "-p"},     // the same, last
		{"-Z", "h", "c"}, // not an ssh option
		{"user@", "c"},
		{"--"},
	} {
		if got, err := parseArgs(args); err == nil {
			t.Errorf("parseArgs(%q) = %+v; want an error", args, got)
		}
	}
}
