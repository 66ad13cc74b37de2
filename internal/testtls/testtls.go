// Package testtls makes the certificates of tests that speak TLS to a real
// server on loopback (a nats-server with client certificates).
package testtls

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files writes a CA (ca.pem), a server certificate for 127.0.0.1
// (server.pem, server-key.pem) and client certificates for the given common
// names (<name>.pem, <name>-key.pem) into a temporary directory, valid for
// an hour, and returns the directory.
func Files(t *testing.T, clients ...string) (dir string) {
	t.Helper()
	dir = t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "zidane test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name string, blocks ...*pem.Block) {
		var b bytes.Buffer
		for _, bl := range blocks {
			_ = pem.Encode(&b, bl)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	issue := func(name string, tmpl *x509.Certificate) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		write(name+".pem", &pem.Block{Type: "CERTIFICATE", Bytes: der})
		write(name+"-key.pem", &pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	issue("server", &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	for i, cn := range clients {
		issue(cn, &x509.Certificate{SerialNumber: big.NewInt(int64(10 + i)), Subject: pkix.Name{CommonName: cn},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	}
	return dir
}
