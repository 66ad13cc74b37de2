package message

import (
	"strings"
	"testing"
)

// body4KiB is policy's BenchmarkInspect4KiB body: a sessions send with a
// 4 KiB prompt.
var body4KiB = []byte(`{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"send","sessionId":"s_123","prompt":"` + strings.Repeat("lorem ipsum ", 330) + `"}}}`)

func BenchmarkRead4KiB(b *testing.B) {
	b.SetBytes(int64(len(body4KiB)))
	b.ReportAllocs()
	for b.Loop() {
		body, err := Read(body4KiB)
		if err != nil || body.Calls[0].Verb != "send" {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadSmall(b *testing.B) {
	raw := []byte(`{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from the benchmark client"}}}`)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		body, err := Read(raw)
		if err != nil || body.Calls[0].Tool != "echo" {
			b.Fatal(err)
		}
	}
}
