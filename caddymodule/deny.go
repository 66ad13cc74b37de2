package caddymodule

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
)

// What agents are denied, and where it comes from.
//
// The zidane app, each zidane_mcp handler and each zidane_audit log writer
// hold their own files in agentDeny from Provision to Cleanup: Caddy
// provisions handlers and log writers apart from the app, and a reload
// provisions the new config before it cleans up the old, so each module
// answers for its own, whichever way its config was loaded.
//
// Caddy's own modules (the tls app's key files, file logs, a {file.…}
// placeholder in a reverse_proxy header) hold nothing here, and Caddy
// keeps the running config to itself while it provisions one. So the
// zidane app reads the config this process was started with (`caddy run
// --config F [--adapter A]`, in its own arguments): F, the files it
// imports, and what Caddy's modules read in it, F read again at every
// reload, which is how `caddy reload --config F` reloads. A config loaded
// as JSON through the admin API (POST /load, or reload from another file)
// names no file: for it, autosave.json (in Caddy's config directory) is
// read at each check once Caddy has written it in this process, or with
// --resume. Caddy writes it just after the new config starts, and never
// with `persist_config off`: the files of Caddy's own modules in such a
// config are the ones the sandbox may miss (the modules of this project
// hold theirs all the same).

// agentDeny holds the files of every provisioned module of this project.
var agentDeny gatewayfiles.Registry

// processStart tells an autosave.json this process wrote from an older one.
var processStart = time.Now()

// deniedFiles are the paths every session engine keeps from agents now.
func deniedFiles() []gatewayfiles.File {
	return gatewayfiles.Merge(agentDeny.Files(), autosaveFiles())
}

// Why texts of the files this package names.
const (
	whyDataDir        = "Caddy's data directory (its storage: tokens, keys, certificates)"
	whyConfigDir      = "Caddy's configuration directory (autosave.json)"
	whyStorage        = "Caddy's storage"
	whyNATS           = "a file that logs into NATS (storage zidane_nats's creds, tls_cert or tls_key)"
	whyCredentials    = "systemd's credentials directory ($CREDENTIALS_DIRECTORY)"
	whyUpstreams      = "an upstreams_file"
	whyOAuthKey       = "an upstream's oauth private_key_file"
	whyIDToken        = "an upstream's oauth id_token_file"
	whyAssertion      = "an upstream's oauth assertion_file (a workload's JWT)"
	whyJWTKey         = "the JWT public_key_file"
	whyAuditLog       = "the zidane_audit log's directory (the audit log, its rotated files and lock)"
	whyCheckpointCopy = "the directory of the zidane_audit checkpoint_copy (the log's latest checkpoint, kept apart)"
	whyConfigFile     = "the --config file caddy was started with"
	whyImported       = "a file the --config Caddyfile imports"
	whyEnvFile        = "an --envfile caddy was started with"
	whyAutosaveFile   = "the config Caddy runs (autosave.json)"
)

// runFlags are the flags of `caddy run` that name files of the config.
type runFlags struct {
	config, adapter string
	envFiles        []string
	resume          bool
}

// parseRunFlags reads the `caddy run` flags in args (os.Args). Caddy's
// command line is parsed by cobra inside caddycmd, which keeps the result
// to itself, so the few flags needed are read again here, as pflag reads
// them (--flag value, --flag=value, -c value, -cvalue; --envfile a,b).
func parseRunFlags(args []string) (runFlags, bool) {
	var f runFlags
	if len(args) < 2 || args[1] != "run" {
		return f, false
	}
	rest := args[2:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(a, "=")
		long := strings.HasPrefix(name, "--")
		if !long && len(a) > 2 && a[0] == '-' && (a[1] == 'c' || a[1] == 'a') {
			// A shorthand with its value attached: -cFILE or -c=FILE.
			name, value, hasValue = a[:2], strings.TrimPrefix(a[2:], "="), true
		}
		var target *string
		switch name {
		case "--config", "-c":
			target = &f.config
		case "--adapter", "-a":
			target = &f.adapter
		case "--envfile":
		case "--resume", "-r":
			f.resume = true
			continue
		default:
			continue
		}
		if !hasValue {
			if i+1 >= len(rest) {
				break
			}
			i++
			value = rest[i]
		}
		if target != nil {
			*target = value
		} else {
			for _, e := range strings.Split(value, ",") {
				if e != "" {
					f.envFiles = append(f.envFiles, e)
				}
			}
		}
	}
	return f, true
}

// processConfigFiles are the files named by this process's arguments: the
// --config file (or the Caddyfile that `caddy run` takes from its working
// directory without one), what it imports, what Caddy's modules read in
// it, and the --envfile files.
func processConfigFiles(args []string, log *zap.Logger) []gatewayfiles.File {
	flags, ok := parseRunFlags(args)
	if !ok {
		return nil
	}
	var out []gatewayfiles.File
	add := func(path, why string) {
		if f, ok := gatewayfiles.Abs(path, why); ok {
			out = append(out, f)
		}
	}
	for _, e := range flags.envFiles {
		add(e, whyEnvFile)
	}
	file, adapter := flags.config, flags.adapter
	if file == "" && adapter == "" {
		if _, err := os.Stat("Caddyfile"); err == nil {
			file = "Caddyfile"
		}
	}
	if file == "" || file == "-" {
		return out
	}
	add(file, whyConfigFile)
	body, err := os.ReadFile(file)
	if err != nil {
		log.Warn("the config file caddy was started with cannot be read again to find the files its modules read; agents are denied the file itself", zap.String("file", file), zap.Error(err))
		return out
	}
	if adapter == "" && isCaddyfileName(file) {
		adapter = "caddyfile"
	}
	cfg := body
	if adapter != "" {
		a := caddyconfig.GetAdapter(adapter)
		if a == nil {
			return out
		}
		if cfg, _, err = a.Adapt(body, map[string]any{"filename": file}); err != nil {
			log.Warn("the config file caddy was started with does not adapt now; the files its modules read are not denied to agents until it does", zap.String("file", file), zap.Error(err))
			return out
		}
	}
	if adapter == "caddyfile" {
		for _, f := range caddyfileImports(file, body) {
			add(f, whyImported)
		}
	}
	inCfg, err := gatewayfiles.InConfig(cfg, expandLogName)
	if err != nil {
		log.Warn("the config file caddy was started with is not a config; the files its modules read are not denied to agents", zap.String("file", file), zap.Error(err))
	}
	return gatewayfiles.Merge(out, inCfg)
}

// isCaddyfileName is caddycmd's rule for taking a file as a Caddyfile when
// no adapter is named: its name starts with "caddyfile" or ends with
// ".caddyfile" (any case), and it is not .json.
func isCaddyfileName(file string) bool {
	base := strings.ToLower(filepath.Base(file))
	return filepath.Ext(base) != ".json" && (strings.HasPrefix(base, "caddyfile") || strings.HasSuffix(base, ".caddyfile"))
}

// caddyfileImports are the files other than file whose tokens the
// Caddyfile body holds: those it imports, as the parser expanded them.
func caddyfileImports(file string, body []byte) []string {
	blocks, err := caddyfile.Parse(file, body)
	if err != nil {
		return nil
	}
	self, _ := filepath.Abs(file)
	var out []string
	note := func(tokens []caddyfile.Token) {
		for _, t := range tokens {
			if t.File == "" {
				continue
			}
			if abs, err := filepath.Abs(t.File); err == nil && abs != self && !slices.Contains(out, abs) {
				out = append(out, abs)
			}
		}
	}
	for _, b := range blocks {
		note(b.Keys)
		for _, s := range b.Segments {
			note(s)
		}
	}
	return out
}

// expandLogName replaces the placeholders of a log file's name as Caddy's
// file writer does.
func expandLogName(name string) string {
	if out, err := caddy.NewReplacer().ReplaceOrErr(name, true, true); err == nil {
		return out
	}
	return name
}

// autosave caches what autosave.json names, by its modification time and
// size.
var autosave struct {
	mu    sync.Mutex
	mod   time.Time
	size  int64
	files []gatewayfiles.File
}

// autosaveFiles are the files of Caddy's own modules in the config Caddy
// last autosaved, when this process wrote it or resumed from it.
func autosaveFiles() []gatewayfiles.File {
	fi, err := os.Stat(caddy.ConfigAutosavePath)
	if err != nil {
		return nil
	}
	flags, _ := parseRunFlags(os.Args)
	if fi.ModTime().Before(processStart) && !flags.resume {
		return nil
	}
	autosave.mu.Lock()
	defer autosave.mu.Unlock()
	if fi.ModTime().Equal(autosave.mod) && fi.Size() == autosave.size {
		return autosave.files
	}
	body, err := os.ReadFile(caddy.ConfigAutosavePath)
	if err != nil {
		return autosave.files
	}
	files, err := gatewayfiles.InConfig(body, expandLogName)
	if err != nil {
		return autosave.files
	}
	for i := range files {
		files[i].Why += " in " + whyAutosaveFile
	}
	autosave.mod, autosave.size, autosave.files = fi.ModTime(), fi.Size(), files
	return files
}

// logDir is the directory of a log file, which also holds its rotated
// files and lock; the file itself when that directory is the root.
func logDir(path, why string) gatewayfiles.File {
	dir := filepath.Dir(path)
	if dir == string(filepath.Separator) {
		return gatewayfiles.File{Path: path, Why: why}
	}
	return gatewayfiles.File{Path: dir, Why: why}
}

// checkSandboxes refuses an agent whose sandbox read or write path is,
// holds or is inside a path of deny: the sandbox would have to give it
// what it keeps from every agent.
func checkSandboxes(agents map[string]*AgentConfig, deny []gatewayfiles.File) error {
	names := make([]string, 0, len(agents))
	for n := range agents {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		ac := agents[name]
		if ac == nil || ac.Sandbox == nil || ac.Sandbox.Off {
			continue
		}
		for _, rw := range []struct {
			what  string
			paths []string
		}{{"read", ac.Sandbox.Read}, {"write", ac.Sandbox.Write}} {
			for _, p := range rw.paths {
				if f, how, ok := gatewayfiles.Reach(p, deny); ok {
					return fmt.Errorf("zidane: agent %s: sandbox %s %s %s, which the sandbox keeps from agents (read and write): give a path that holds none of the gateway's secrets or logs", name, rw.what, p, gatewayfiles.Describe(f, how))
				}
			}
		}
	}
	return nil
}
