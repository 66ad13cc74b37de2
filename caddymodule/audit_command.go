package caddymodule

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/auditchain"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, auditCommand)
}

// publicKeyFileLimit bounds a --public-key file.
const publicKeyFileLimit = 64 << 10

// auditCommand is `caddy zidane audit verify|public-key`.
func auditCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "audit",
		Short: "Verifies a zidane_audit log, and prints the public key that verifies it",
	}
	c.AddCommand(auditVerifyCommand(), auditPublicKeyCommand())
	return c
}

func auditVerifyCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "verify --public-key FILE|BASE64 [--partial] FILE...",
		Short: "Checks the hash chain and the signed checkpoints of an audit log, across its rotated files",
		Long: `
Checks the audit log that the zidane_audit log writer wrote: every record's
seq follows the one before it and its prev is the SHA-256 of that record,
across the files given (the current file and its rotated ones, compressed or
not, in any order: they are put in order by their first seq), and every
checkpoint's Ed25519 signature verifies with a key given.

It exits 0 when the chain holds, and otherwise 1 with FILE:LINE and the seq
of the first record that was removed, reordered or changed, or cut short.

Records after the last checkpoint are chained but not signed: whoever can
write the file can cut them off (or rewrite them, the chain recomputed)
unnoticed. The output says how many there are, and whether the log ends
with the checkpoint that caddy writes when it stops.`,
		Example: `  caddy zidane audit verify --public-key audit-public.key /var/log/caddy/zidane-audit*.log*`,
		Args:    cobra.MinimumNArgs(1),
		RunE: caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
			values, err := fl.GetStringArray("public-key")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if len(values) == 0 {
				return caddy.ExitCodeFailedStartup, errors.New("give --public-key: the key that verifies the checkpoints, as `caddy zidane audit public-key` prints it where the signing key is set")
			}
			var keys []ed25519.PublicKey
			for _, v := range values {
				k, err := readPublicKey(v)
				if err != nil {
					return caddy.ExitCodeFailedStartup, fmt.Errorf("--public-key %s: %w", v, err)
				}
				keys = append(keys, k)
			}
			var srcs []auditchain.Source
			for _, p := range fl.Args() {
				srcs = append(srcs, auditchain.FileSource(p))
			}
			rep, err := auditchain.Verify(srcs, auditchain.Options{Keys: keys, Partial: fl.Bool("partial")})
			if err != nil {
				var f *auditchain.Failure
				if errors.As(err, &f) {
					return caddy.ExitCodeFailedStartup, fmt.Errorf("audit log verification FAILED (%s): %w", f.Kind, f)
				}
				return caddy.ExitCodeFailedStartup, fmt.Errorf("audit log verification failed: %w", err)
			}
			printAuditReport(os.Stdout, rep)
			if rep.Records == 0 {
				return caddy.ExitCodeFailedStartup, errors.New("no audit record in the files given")
			}
			return caddy.ExitCodeSuccess, nil
		}),
	}
	c.Flags().StringArray("public-key", nil, "The public key: a file holding it, or the key itself in base64 (repeat for a key rotated on reload)")
	c.Flags().Bool("partial", false, "Accept a chain that begins after seq 1 (its oldest files were rotated away)")
	return c
}

// readPublicKey reads a --public-key value: the key in base64, or a file.
func readPublicKey(v string) (ed25519.PublicKey, error) {
	if k, err := auditchain.ParsePublicKey([]byte(v)); err == nil {
		return k, nil
	}
	f, err := os.Open(v)
	if err != nil {
		return nil, fmt.Errorf("neither a public key in base64 nor a file: %v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, publicKeyFileLimit+1))
	if err != nil {
		return nil, err
	}
	if len(b) > publicKeyFileLimit {
		return nil, errors.New("the file is over 64 KiB: no public key is")
	}
	return auditchain.ParsePublicKey(b)
}

func printAuditReport(w io.Writer, rep *auditchain.Report) {
	for _, e := range rep.Empty {
		fmt.Fprintf(w, "%s holds no record\n", e)
	}
	if rep.Records == 0 {
		return
	}
	fmt.Fprintf(w, "OK: %d records, seq %d to %d, chained in %d file(s): %s\n", rep.Records, rep.First, rep.Last, len(rep.Files), strings.Join(rep.Files, ", "))
	fmt.Fprintf(w, "%d checkpoint(s) verify, signed by key %s; the last is seq %d (%s) at %s\n",
		rep.Checkpoints, strings.Join(rep.KeyIDs, ", then "), rep.LastCheckpointSeq, rep.LastCheckpointReason, rep.LastCheckpoint)
	for _, r := range rep.Recovered {
		fmt.Fprintf(w, "note: %s is a record cut short by a crash or a failed write, which the checkpoint after it acknowledges\n", r)
	}
	if rep.First > 1 {
		fmt.Fprintf(w, "note: the chain begins at seq %d: seqs 1 to %d are not in the files given, and their removal cannot be told from these files\n", rep.First, rep.First-1)
	}
	if rep.Unsigned > 0 {
		fmt.Fprintf(w, "WARNING: the last %d record(s), seq %d to %d, follow the last checkpoint: they are chained but not signed, so cutting them off (or rewriting them with the chain recomputed) would go unnoticed\n",
			rep.Unsigned, rep.Last-uint64(rep.Unsigned)+1, rep.Last)
	}
	if rep.LastCheckpointReason != auditchain.ReasonStop || rep.Unsigned > 0 {
		fmt.Fprintf(w, "WARNING: the log does not end with a stop checkpoint: caddy is still writing it, or it stopped without one (a crash, a kill), or records after seq %d were removed\n", rep.LastCheckpointSeq)
	} else {
		fmt.Fprintln(w, "The log ends with the checkpoint caddy writes when it stops.")
	}
}

// auditPublicKeyCommand is `caddy zidane audit public-key`.
func auditPublicKeyCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "public-key [--env VAR]",
		Short: "Prints the public key (and its id) of the audit signing key in the environment",
		Long: `
Reads the audit log's signing key from the environment variable VAR (by
default ZIDANE_AUDIT_SIGNING_KEY), as caddy does, and prints the public key
that verifies its checkpoints, in base64, for ` + "`caddy zidane audit verify --public-key`" + `.
It never prints the signing key.`,
		Args: cobra.NoArgs,
		RunE: caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
			name := fl.String("env")
			v := os.Getenv(name)
			if strings.TrimSpace(v) == "" {
				return caddy.ExitCodeFailedStartup, fmt.Errorf("%s is empty: set it to the audit signing key (32 random bytes in base64: `openssl rand -base64 32`)", name)
			}
			s, err := auditchain.ParseSigningKey(v)
			if err != nil {
				return caddy.ExitCodeFailedStartup, fmt.Errorf("%s %w", name, err)
			}
			fmt.Println(auditchain.EncodePublicKey(s.Public()))
			fmt.Fprintf(os.Stderr, "key id %s\n", s.KeyID())
			return caddy.ExitCodeSuccess, nil
		}),
	}
	c.Flags().String("env", AuditSigningKeyEnv, "The environment variable that holds the signing key")
	return c
}
