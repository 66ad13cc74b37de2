package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func mustNew(t *testing.T, k []byte, purpose string) *Sealer {
	t.Helper()
	s, err := New(k, purpose)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// What one Sealer seals opens only under the same key, purpose and
// associated data, unaltered; every seal draws a new nonce.
func TestSealBindsKeyPurposeAndAD(t *testing.T) {
	s := mustNew(t, key(1), "session id")
	plain := []byte("upstream-session-1")
	ad := AD("tok_1", "broker:github")
	sealed := s.Seal(nil, plain, ad)
	if got, err := s.Open(nil, sealed, ad); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if again := s.Seal(nil, plain, ad); bytes.Equal(again, sealed) || bytes.Equal(again[:12], sealed[:12]) {
		t.Error("two seals of one value share a nonce")
	}
	if len(sealed) != len(plain)+s.Overhead() {
		t.Errorf("sealed is %d bytes, want %d", len(sealed), len(plain)+s.Overhead())
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)/2] ^= 1
	for name, try := range map[string]func() ([]byte, error){
		"another purpose": func() ([]byte, error) { return mustNew(t, key(1), "session ie").Open(nil, sealed, ad) },
		"another key":     func() ([]byte, error) { return mustNew(t, key(2), "session id").Open(nil, sealed, ad) },
		"another ad":      func() ([]byte, error) { return s.Open(nil, sealed, AD("tok_2", "broker:github")) },
		"ad shifted":      func() ([]byte, error) { return s.Open(nil, sealed, AD("tok_1b", "roker:github")) },
		"altered":         func() ([]byte, error) { return s.Open(nil, tampered, ad) },
		"cut":             func() ([]byte, error) { return s.Open(nil, sealed[:len(sealed)-1], ad) },
		"too short":       func() ([]byte, error) { return s.Open(nil, sealed[:5], ad) },
		"unbound":         func() ([]byte, error) { return s.OpenUnbound(nil, sealed, ad) },
	} {
		if got, err := try(); !errors.Is(err, ErrOpen) || got != nil {
			t.Errorf("%s: %q, %v; want ErrOpen", name, got, err)
		}
	}
}

// The purpose is bound so that it cannot run into the associated data: a
// purpose that ends where the data begins is another binding.
func TestPurposeAndADDoNotRunTogether(t *testing.T) {
	a := mustNew(t, key(1), "ab")
	b := mustNew(t, key(1), "a")
	if _, err := b.Open(nil, a.Seal(nil, []byte("x"), []byte("c")), []byte("bc")); !errors.Is(err, ErrOpen) {
		t.Errorf("(ab, c) opened as (a, bc): %v", err)
	}
	if bytes.Equal(AD("a", "bc"), AD("ab", "c")) {
		t.Error("AD(a, bc) == AD(ab, c)")
	}
}

// A value that the code before this package sealed (AES-256-GCM, nonce
// first, the associated data alone) opens with OpenUnbound, and only so.
func TestOpenUnbound(t *testing.T) {
	block, _ := aes.NewCipher(key(4))
	old, _ := cipher.NewGCM(block)
	nonce := bytes.Repeat([]byte{9}, old.NonceSize())
	legacy := old.Seal(bytes.Clone(nonce), nonce, []byte("kept"), []byte("where"))
	s := mustNew(t, key(4), "storage")
	if got, err := s.OpenUnbound(nil, legacy, []byte("where")); err != nil || string(got) != "kept" {
		t.Fatalf("OpenUnbound = %q, %v", got, err)
	}
	if _, err := s.Open(nil, legacy, []byte("where")); !errors.Is(err, ErrOpen) {
		t.Errorf("Open took a value without the purpose: %v", err)
	}
}

func TestNewRefuses(t *testing.T) {
	if _, err := New(key(1)[:16], "x"); err == nil {
		t.Error("a 16-byte key was taken")
	}
	if _, err := New(key(1), ""); err == nil {
		t.Error("an empty purpose was taken")
	}
}

func BenchmarkSealOpen(b *testing.B) {
	s, _ := New(key(1), "session id")
	plain, ad := []byte("upstream-session-0123456789abcdef"), AD("tok_1", "broker:github")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Open(nil, s.Seal(nil, plain, ad), ad); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOneSealer: no other package of the module builds a cipher of its
// own; everything sealed goes through this package.
func TestOneSealer(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata" || path == self {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "crypto/aes" || p == "crypto/cipher" {
				t.Errorf("%s imports %s: seal with internal/seal instead", fset.Position(imp.Pos()), p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
