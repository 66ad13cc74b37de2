package gatewayfiles

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// filePrefix starts the key of a placeholder that Caddy's replacer answers
// with a file's contents: {file.PATH}.
const filePrefix = "file."

// Placeholders returns the paths that the {file.PATH} placeholders in s
// read. It scans as Caddy's replacer does (a placeholder runs from an
// unescaped { to the next } that is not escaped), but also looks inside
// what the replacer would skip as unknown, and takes the key up to the
// first } as well, so it finds every file the replacer could read and
// perhaps more, never fewer.
func Placeholders(s string) []string {
	var out []string
	add := func(key string) {
		if path, ok := strings.CutPrefix(key, filePrefix); ok && path != "" && !slices.Contains(out, path) {
			out = append(out, path)
		}
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '{' || (i > 0 && s[i-1] == '\\') {
			continue
		}
		first := strings.IndexByte(s[i+1:], '}')
		if first < 0 {
			break
		}
		end := i + 1 + first
		add(s[i+1 : end])
		// The replacer's key runs past a } escaped with \, to the next
		// one, and keeps the backslashes: {file./a\}b} reads "/a\}b".
		for end < len(s)-1 && s[end-1] == '\\' {
			next := strings.IndexByte(s[end+1:], '}')
			if next < 0 {
				break
			}
			end += next + 1
			add(s[i+1 : end])
		}
	}
	return out
}

// PlaceholderFiles are the files that {file.…} placeholders read anywhere
// in v, a value that marshals to JSON (a module's config).
func PlaceholderFiles(v any) []File {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var doc any
	if json.Unmarshal(raw, &doc) != nil {
		return nil
	}
	var out []File
	walkStrings(doc, func(s string) {
		for _, p := range Placeholders(s) {
			if f, ok := Abs(p, WhyPlaceholder); ok {
				out = append(out, f)
			}
		}
	})
	return Merge(out)
}

// walkStrings calls fn with every string in doc, keys included.
func walkStrings(doc any, fn func(string)) {
	switch v := doc.(type) {
	case string:
		fn(v)
	case []any:
		for _, e := range v {
			walkStrings(e, fn)
		}
	case map[string]any:
		for k, e := range v {
			fn(k)
			walkStrings(e, fn)
		}
	}
}

// InConfig returns the files of a Caddy config (JSON, as adapted) that
// hold secrets or evidence, as Caddy's own modules read or write them:
// every {file.…} placeholder's file, anywhere in it; the directory of each
// `file` log output (its rotated files go beside it; the file itself when
// that directory is the root); the tls app's load_files and load_folders;
// the pki app's CA certificate and key files; and the client certificate
// and key files of reverse_proxy transports. expand replaces the
// placeholders of a log file's name as Caddy's file writer does; nil
// leaves names as they are. Relative paths are taken from the working
// directory, as Caddy takes them.
func InConfig(cfg []byte, expand func(string) string) ([]File, error) {
	var doc map[string]any
	if err := json.Unmarshal(cfg, &doc); err != nil {
		return nil, fmt.Errorf("reading the config as JSON: %w", err)
	}
	if expand == nil {
		expand = func(s string) string { return s }
	}
	var out []File
	add := func(path, why string) {
		if f, ok := Abs(path, why); ok {
			out = append(out, f)
		}
	}
	walkStrings(doc, func(s string) {
		for _, p := range Placeholders(s) {
			add(p, WhyPlaceholder)
		}
	})
	for _, l := range object(object(doc, "logging"), "logs") {
		w := object(asMap(l), "writer")
		if str(w, "output") != "file" {
			continue
		}
		if name := expand(str(w, "filename")); name != "" {
			if abs, err := filepath.Abs(name); err == nil {
				dir := filepath.Dir(abs)
				if dir == string(filepath.Separator) {
					add(abs, WhyCaddyLog)
				} else {
					add(dir, WhyCaddyLog)
				}
			}
		}
	}
	certs := object(object(object(doc, "apps"), "tls"), "certificates")
	for _, pair := range list(certs, "load_files") {
		m := asMap(pair)
		add(str(m, "certificate"), WhyTLS)
		add(str(m, "key"), WhyTLS)
	}
	for _, dir := range list(certs, "load_folders") {
		if s, ok := dir.(string); ok {
			add(s, WhyTLSFolder)
		}
	}
	for _, ca := range object(object(object(doc, "apps"), "pki"), "certificate_authorities") {
		for _, which := range []string{"root", "intermediate"} {
			kp := object(asMap(ca), which)
			if f := str(kp, "format"); f != "" && f != "pem_file" {
				continue
			}
			add(str(kp, "certificate"), WhyPKI)
			add(str(kp, "private_key"), WhyPKI)
		}
	}
	walkObjects(doc, func(m map[string]any) {
		add(str(m, "client_certificate_file"), WhyClientCert)
		add(str(m, "client_certificate_key_file"), WhyClientCert)
	})
	return Merge(out), nil
}

// walkObjects calls fn with every object in doc.
func walkObjects(doc any, fn func(map[string]any)) {
	switch v := doc.(type) {
	case []any:
		for _, e := range v {
			walkObjects(e, fn)
		}
	case map[string]any:
		fn(v)
		for _, e := range v {
			walkObjects(e, fn)
		}
	}
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func object(m map[string]any, key string) map[string]any { return asMap(m[key]) }

func list(m map[string]any, key string) []any {
	l, _ := m[key].([]any)
	return l
}

func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}
