package caddymodule

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/caddyserver/certmagic"
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
		Use:   "verify --public-key FILE|BASE64 [--partial] [--anchor FILE | --no-anchor] FILE...",
		Short: "Checks the hash chain and the signed checkpoints of an audit log, across its rotated files, against its latest checkpoint kept outside it",
		Long: `
Checks the audit log that the zidane_audit log writer wrote: every record's
seq follows the one before it and its prev is the SHA-256 of that record,
across the files given (the current file and its rotated ones, compressed or
not, in any order: they are put in order by their first seq), and every
checkpoint's Ed25519 signature verifies with a key given.

Records up to a checkpoint cannot be changed unnoticed, but a log cut right
after any checkpoint (an earlier run's stop checkpoint included) holds
together on its own. So caddy keeps each log's latest checkpoint outside it,
in its storage (shared by every replica of a cluster), and verify compares
the log with it: a log that ends before it fails as cut, naming the seq it
expected next. With a server answering (--address, or the admin address of
--config), verify reads it through the admin API; with none, from the
storage of --config (Caddy's file storage by default); a storage in NATS is
read through a running server. --anchor FILE compares with a checkpoint kept
elsewhere instead (the writer's checkpoint_copy, or a line saved from the
storage). --no-anchor verifies the files alone, which cannot tell a cut
after a checkpoint.

It prints its findings on stdout, one plain line each. It exits 0 when the
chain holds up to the kept checkpoint; otherwise 1, after a line that starts
with FAILED and gives FILE:LINE and the seq of the first record that was
removed, reordered or changed, or where the log was cut, or one that starts
with INCOMPLETE when there was no kept checkpoint to compare the log with.
A key or file it cannot read is said on stderr, with exit status 1.

Records after the last checkpoint are chained but not signed: whoever can
write the file can cut them off (or rewrite them, the chain recomputed)
unnoticed. The output says how many there are.`,
		Example: `  caddy zidane audit verify --public-key audit-public.key /var/log/caddy/zidane-audit*.log*
  caddy zidane audit verify --public-key audit-public.key --anchor /mnt/audit-copy/zidane-audit.checkpoint /var/log/caddy/zidane-audit*.log*`,
		Args: cobra.MinimumNArgs(1),
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			values, err := fl.GetStringArray("public-key")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if len(values) == 0 {
				return caddy.ExitCodeFailedStartup, errors.New("give --public-key: the key that verifies the checkpoints, as `caddy zidane audit public-key` prints it where the signing key is set")
			}
			noAnchor := fl.Bool("no-anchor")
			if noAnchor && fl.String("anchor") != "" {
				return caddy.ExitCodeFailedStartup, errors.New("give --anchor FILE or --no-anchor, not both")
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
			opts := auditchain.Options{Keys: keys, Partial: fl.Bool("partial")}
			where := ""
			if !noAnchor {
				opts.Anchor = keptCheckpointLookup(fl, &where)
			}
			rep, err := auditchain.Verify(srcs, opts)
			if err != nil {
				var f *auditchain.Failure
				if !errors.As(err, &f) {
					return caddy.ExitCodeFailedStartup, fmt.Errorf("could not verify: %w", err)
				}
				fmt.Printf("FAILED (%s): %v\n", f.Kind, f)
				return caddy.ExitCodeFailedStartup, nil
			}
			printAuditReport(os.Stdout, rep)
			if verdict := auditIncomplete(rep, noAnchor, where); verdict != "" {
				fmt.Println(verdict)
				return caddy.ExitCodeFailedStartup, nil
			}
			return caddy.ExitCodeSuccess, nil
		}),
	}
	c.Flags().StringArray("public-key", nil, "The public key: a file holding it, or the key itself in base64 (repeat for a key rotated on reload)")
	c.Flags().Bool("partial", false, "Accept a chain that begins after seq 1 (its oldest files were rotated away)")
	c.Flags().String("anchor", "", "Compare the log with the checkpoint in this file (a checkpoint_copy), instead of the one in Caddy's storage")
	c.Flags().Bool("no-anchor", false, "Verify the files alone: a cut after a checkpoint then goes unnoticed")
	adminFlags(c)
	return c
}

// auditIncomplete is verify's verdict on a chain that holds together but
// cannot be told whole, or "" when it can.
func auditIncomplete(rep *auditchain.Report, noAnchor bool, where string) string {
	switch {
	case rep.Records == 0:
		return "FAILED: no audit record in the files given"
	case noAnchor:
		return ""
	case rep.Chain == "":
		return "INCOMPLETE: the log's checkpoints name no chain (caddy wrote them before it kept checkpoints outside the log), so there is no kept checkpoint to compare its end with; pass --no-anchor to verify the files alone"
	case rep.Anchor == nil:
		return fmt.Sprintf("INCOMPLETE: no checkpoint of this log's chain (%s) is kept in %s, so a cut after its last checkpoint cannot be told: verify against the storage of the caddy that wrote it (--address, or --config), or a copy (--anchor FILE); pass --no-anchor to verify the files alone", rep.Chain, where)
	}
	return ""
}

// keptCheckpointLookup is verify's look-up of a chain's latest checkpoint
// kept outside the log: --anchor's file, else the storage of the running
// server (through its admin API), else the storage of --config, read
// directly. It sets where to what it reads.
func keptCheckpointLookup(fl caddycmd.Flags, where *string) func(chain string) (*auditchain.Anchor, error) {
	return func(chain string) (*auditchain.Anchor, error) {
		if p := fl.String("anchor"); p != "" {
			*where = p
			a, err := readCheckpointCopy(p)
			if err != nil {
				return nil, fmt.Errorf("--anchor: %w", err)
			}
			return a, nil
		}
		admin, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
		if err == nil && adminAnswers(admin) {
			*where = "the storage of the caddy whose admin API is " + admin
			var ans keptCheckpointAnswer
			if err := adminJSON(admin, http.MethodGet, "/zidane/audit/checkpoints/"+chain, nil, &ans); err != nil {
				return nil, fmt.Errorf("reading the log's kept checkpoint through the admin API at %s: %w", admin, err)
			}
			if ans.Checkpoint == "" {
				return nil, nil
			}
			return auditchain.ParseAnchor([]byte(ans.Checkpoint), ans.Key+" in "+*where)
		}
		st, desc, closeStorage, err := cliStorage(fl.String("config"), fl.String("adapter"))
		if err != nil {
			return nil, fmt.Errorf("no server answers at %s, and %w", admin, err)
		}
		defer closeStorage()
		*where = desc
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return loadKeptCheckpoint(ctx, st, chain)
	}
}

// errCheckpointsInNATS is why the CLI cannot read the kept checkpoints
// with no server running.
var errCheckpointsInNATS = errors.New("the audit log's checkpoints are kept in NATS (storage zidane_nats), which the CLI reaches through a running server only: run verify while one answers its admin API (--address), or give --anchor FILE")

// cliStorage opens, to read, the storage that configFile names (Caddy's
// file storage without one), as `caddy storage export` does; release
// lets it go.
func cliStorage(configFile, adapter string) (st certmagic.Storage, desc string, release func(), err error) {
	var cfg struct {
		StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`
		Apps       struct {
			Zidane struct {
				Cluster json.RawMessage `json:"cluster"`
			} `json:"zidane"`
		} `json:"apps"`
	}
	if configFile != "" {
		raw, _, _, err := caddycmd.LoadConfig(configFile, adapter)
		if err != nil {
			return nil, "", nil, err
		}
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return nil, "", nil, fmt.Errorf("reading %s: %w", configFile, err)
		}
	}
	var module struct {
		Module string `json:"module"`
	}
	_ = json.Unmarshal(cfg.StorageRaw, &module)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if module.Module == "zidane_nats" || len(cfg.Apps.Zidane.Cluster) > 0 || (configFile == "" && caddy.DefaultStorage.Exists(ctx, clusterMarkerKey)) {
		return nil, "", nil, errCheckpointsInNATS
	}
	if len(cfg.StorageRaw) == 0 {
		return caddy.DefaultStorage, "the file storage at " + caddy.DefaultStorage.Path, func() {}, nil
	}
	cctx, ccancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	val, err := cctx.LoadModule(&cfg, "StorageRaw")
	if err != nil {
		ccancel()
		return nil, "", nil, fmt.Errorf("the storage of %s: %w", configFile, err)
	}
	if st, err = val.(caddy.StorageConverter).CertMagicStorage(); err != nil {
		ccancel()
		return nil, "", nil, fmt.Errorf("the storage of %s: %w", configFile, err)
	}
	return st, storageName(st) + " (the storage of " + configFile + ")", ccancel, nil
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
	switch a := rep.Anchor; {
	case a != nil && rep.AnchorBefore:
		fmt.Fprintf(w, "WARNING: the latest checkpoint kept outside the log (%s) is seq %d, before the first record given (seq %d), so the log could not be compared with it: it lags, or was rolled back\n", a.From, a.Seq, rep.First)
	case a != nil:
		fmt.Fprintf(w, "The log holds the latest checkpoint kept outside it (%s), seq %d, at %s: no record up to it was removed.\n", a.From, a.Seq, rep.AnchorAt)
		if rep.CheckpointsAfter > 0 {
			fmt.Fprintf(w, "note: %d checkpoint(s) of the log follow it: caddy wrote them after verify read the kept one, or could not keep them (caddy's log says so)\n", rep.CheckpointsAfter)
		}
	default:
		fmt.Fprintln(w, "WARNING: the log was not compared with a checkpoint kept outside it: a cut right after any checkpoint, an earlier run's stop checkpoint included, cannot be told from these files")
	}
	if rep.Unsigned > 0 {
		fmt.Fprintf(w, "WARNING: the last %d record(s), seq %d to %d, follow the last checkpoint: they are chained but not signed, so cutting them off (or rewriting them with the chain recomputed) would go unnoticed\n",
			rep.Unsigned, rep.Last-uint64(rep.Unsigned)+1, rep.Last)
	}
	if rep.LastCheckpointReason != auditchain.ReasonStop {
		fmt.Fprintln(w, "note: the last checkpoint is no stop checkpoint: caddy is still writing the log, or stopped without one (a crash, a kill)")
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
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
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
