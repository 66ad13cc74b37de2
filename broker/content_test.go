package broker

import (
	"archive/zip"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"image"
	"image/jpeg"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func jpegBytes(t testing.TB) []byte {
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, image.NewGray(image.Rect(0, 0, 2, 2)), nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// wavBytes is a real 8-bit mono PCM WAV file with a few samples.
func wavBytes() []byte {
	samples := []byte{128, 130, 126, 128}
	var b bytes.Buffer
	b.WriteString("RIFF")
	binary.Write(&b, binary.LittleEndian, uint32(36+len(samples)))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(8000), uint32(8000), uint16(1), uint16(8)} {
		binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	binary.Write(&b, binary.LittleEndian, uint32(len(samples)))
	b.Write(samples)
	return b.Bytes()
}

func zipBytes(t testing.TB) []byte {
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	f, err := w.Create("word/document.xml")
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("<w:document/>"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var (
	mp3Frame = append([]byte{0xFF, 0xFB, 0x90, 0x64}, make([]byte, 60)...)
	mp3ID3   = append([]byte("ID3\x04\x00\x00\x00\x00\x00\x00"), mp3Frame...)
	aacADTS  = append([]byte{0xFF, 0xF1, 0x50, 0x80, 0x02, 0x1F, 0xFC}, make([]byte, 20)...)
	oggOpus  = append([]byte("OggS\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00"), []byte("....OpusHead")...)
	flac     = append([]byte("fLaC\x00\x00\x00\x22"), make([]byte, 34)...)
	webp     = append([]byte("RIFF\x24\x00\x00\x00WEBPVP8 "), make([]byte, 24)...)
	m4a      = append([]byte("\x00\x00\x00\x20ftypM4A \x00\x00\x00\x00M4A mp42isom"), make([]byte, 8)...)
	mp4      = append([]byte("\x00\x00\x00\x1cftypisom\x00\x00\x02\x00isomiso2mp41"), make([]byte, 8)...)
	avif     = append([]byte("\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1"), make([]byte, 8)...)
	svg      = []byte(`<?xml version="1.0"?>` + "\n" + `<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>`)
	pdf      = []byte("%PDF-1.7\n1 0 obj\n")
	opaque   = []byte{0x00, 0x01, 0x02, 0x03, 0xFE, 0x00, 0x10}
)

func TestMediaType(t *testing.T) {
	pngData, jpegData, wavData, zipData := upstreamtest.PNGBytes(t), jpegBytes(t), wavBytes(), zipBytes(t)
	tests := []struct {
		name     string
		data     []byte
		declared string
		want     string
	}{
		{"PNG declared as JPEG", pngData, "image/jpeg", "image/png"},
		{"JPEG declared as PNG", jpegData, "image/png", "image/jpeg"},
		{"PNG undeclared", pngData, "", "image/png"},
		{"PNG declared octet-stream", pngData, "application/octet-stream", "image/png"},
		{"WAV declared as MP3", wavData, "audio/mpeg", "audio/wav"},
		{"WAV declared as audio/x-wav", wavData, "audio/x-wav", "audio/wav"},
		{"MP3 frame declared as WAV", mp3Frame, "audio/wav", "audio/mpeg"},
		{"MP3 with ID3", mp3ID3, "", "audio/mpeg"},
		{"AAC ADTS", aacADTS, "audio/mpeg", "audio/aac"},
		{"Ogg Opus", oggOpus, "audio/mpeg", "audio/ogg"},
		{"FLAC", flac, "", "audio/flac"},
		{"WebP declared PNG", webp, "image/png", "image/webp"},
		{"M4A declared video/mp4", m4a, "video/mp4", "audio/mp4"},
		{"MP4 container declared audio", mp4, "audio/mp4", "audio/mp4"},
		{"MP4 container undeclared", mp4, "", "video/mp4"},
		{"AVIF", avif, "image/png", "image/avif"},
		{"SVG declared", svg, "image/svg+xml", "image/svg+xml"},
		{"SVG undeclared", svg, "", "image/svg+xml"},
		{"PDF declared wrong", pdf, "text/plain", "application/pdf"},
		{"unknown bytes keep the declared type", opaque, "image/x-custom", "image/x-custom"},
		{"unknown bytes undeclared", opaque, "", "application/octet-stream"},
		{"JSON text declared", []byte(`{"a": 1}`), "application/json", "application/json"},
		{"CSV text declared", []byte("a,b\n1,2\n"), "text/csv", "text/csv"},
		{"plain text undeclared", []byte("hello"), "", "text/plain; charset=utf-8"},
		{"docx is a ZIP", zipData, "application/vnd.openxmlformats-officedocument.wordprocessingml.document", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"},
		{"ZIP declared as an image", zipData, "image/png", "application/zip"},
		{"same type keeps parameters", pngData, "image/png; x=1", "image/png; x=1"},
		{"no data keeps the declared type", nil, "image/png", "image/png"},
		{"JPEG is not MP3", []byte{0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10, 'J', 'F', 'I', 'F'}, "", "image/jpeg"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MediaType(tt.data, tt.declared); got != tt.want {
				t.Errorf("MediaType = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNormalizeContent(t *testing.T) {
	pngData, wavData := upstreamtest.PNGBytes(t), wavBytes()
	text := &mcp.TextContent{Text: "hello"}
	textRes := &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.md", MIMEType: "text/markdown", Text: "# A"}}
	link := &mcp.ResourceLink{URI: "https://x.example/a.png", Name: "a", MIMEType: "image/jpeg"}
	img := &mcp.ImageContent{Data: pngData, MIMEType: "image/jpeg", Annotations: &mcp.Annotations{Priority: 1}}
	goodImg := &mcp.ImageContent{Data: pngData, MIMEType: "image/png"}
	audio := &mcp.AudioContent{Data: wavData, MIMEType: "audio/mpeg"}
	audioInImage := &mcp.ImageContent{Data: wavData, MIMEType: "image/png", Meta: mcp.Meta{"k": "v"}}
	imageInAudio := &mcp.AudioContent{Data: pngData, MIMEType: "audio/wav"}
	noType := &mcp.ImageContent{Data: pngData}
	blob := &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.bin", MIMEType: "application/octet-stream", Blob: pngData}}
	//lint:ignore SA1019 a sampling block is the one kind of block the SDK has that a result must not hold.
	toolUse := &mcp.ToolUseContent{ID: "1", Name: "search", Input: map[string]any{"q": "x"}}
	var typedNil *mcp.TextContent

	in := []mcp.Content{text, nil, textRes, link, img, goodImg, audio, audioInImage, imageInAudio, noType, blob, toolUse, typedNil}
	out := NormalizeContent(in)
	if len(out) != 11 {
		t.Fatalf("got %d blocks, want 11 (nils dropped): %v", len(out), out)
	}
	if out[0] != text || out[1] != textRes || out[2] != link || out[4] != goodImg {
		t.Error("text, text resource, resource link and a correct image must pass untouched")
	}
	if got := out[3].(*mcp.ImageContent); got.MIMEType != "image/png" || got.Annotations.Priority != 1 || img.MIMEType != "image/jpeg" {
		t.Errorf("PNG declared JPEG: got %q (original now %q)", got.MIMEType, img.MIMEType)
	}
	if got := out[5].(*mcp.AudioContent); got.MIMEType != "audio/wav" || audio.MIMEType != "audio/mpeg" {
		t.Errorf("WAV declared MP3: got %q", got.MIMEType)
	}
	if got, ok := out[6].(*mcp.AudioContent); !ok || got.MIMEType != "audio/wav" || got.Meta["k"] != "v" {
		t.Errorf("WAV in an image block: got %#v", out[6])
	}
	if got, ok := out[7].(*mcp.ImageContent); !ok || got.MIMEType != "image/png" {
		t.Errorf("PNG in an audio block: got %#v", out[7])
	}
	if got := out[8].(*mcp.ImageContent); got.MIMEType != "image/png" {
		t.Errorf("image without a type: got %q", got.MIMEType)
	}
	if got := out[9].(*mcp.EmbeddedResource); got.Resource.MIMEType != "image/png" || got.Resource.URI != "file:///a.bin" || blob.Resource.MIMEType != "application/octet-stream" {
		t.Errorf("blob: got %q", got.Resource.MIMEType)
	}
	got, ok := out[10].(*mcp.TextContent)
	if !ok || !strings.Contains(got.Text, `"type":"tool_use"`) || !strings.Contains(got.Text, `"name":"search"`) {
		t.Errorf("unknown block: got %#v", out[10])
	}
}

func TestDecodeContent(t *testing.T) {
	pngB64 := base64.StdEncoding.EncodeToString(upstreamtest.PNGBytes(t))
	raw := `[
		{"type": "text", "text": "hi"},
		{"type": "image", "data": "` + pngB64 + `", "mimeType": "image/jpeg"},
		{"type": "video", "data": "AAAA", "mimeType": "video/mp4"},
		{"type": "image", "data": "not base64!", "mimeType": "image/png"},
		{"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "body"}}
	]`
	got, err := DecodeContent([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("got %d blocks", len(got))
	}
	if x, ok := got[0].(*mcp.TextContent); !ok || x.Text != "hi" {
		t.Errorf("block 0 = %#v", got[0])
	}
	if x, ok := got[1].(*mcp.ImageContent); !ok || x.MIMEType != "image/png" {
		t.Errorf("block 1 = %#v", got[1])
	}
	if x, ok := got[2].(*mcp.TextContent); !ok || x.Text != `{"type":"video","data":"AAAA","mimeType":"video/mp4"}` {
		t.Errorf("unknown type: %#v", got[2])
	}
	if x, ok := got[3].(*mcp.TextContent); !ok || !strings.Contains(x.Text, "not base64!") {
		t.Errorf("bad base64: %#v", got[3])
	}
	if x, ok := got[4].(*mcp.EmbeddedResource); !ok || x.Resource.Text != "body" {
		t.Errorf("text resource: %#v", got[4])
	}
	if one, err := DecodeContent([]byte(`{"type": "text", "text": "solo"}`)); err != nil || len(one) != 1 {
		t.Errorf("single block: %v, %v", one, err)
	}
	for _, bad := range []string{``, `"x"`, `[1,`, `null`} {
		if _, err := DecodeContent([]byte(bad)); err == nil {
			t.Errorf("DecodeContent(%q) succeeded", bad)
		}
	}
}

func TestFlattenText(t *testing.T) {
	data := make([]byte, 1234)
	content := []mcp.Content{
		&mcp.TextContent{Text: "first"},
		nil,
		&mcp.ImageContent{Data: data, MIMEType: "image/png"},
		&mcp.AudioContent{Data: data[:10], MIMEType: "audio/wav"},
		&mcp.ImageContent{Data: data[:3]},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.txt", Text: "resource text"}},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.bin", MIMEType: "application/pdf", Blob: data[:5]}},
		&mcp.ResourceLink{URI: "https://x.example/doc", Name: "doc"},
		//lint:ignore SA1019 a sampling block is flattened like any other.
		&mcp.ToolResultContent{ToolUseID: "1", Content: []mcp.Content{&mcp.TextContent{Text: "inner"}}},
		(*mcp.ImageContent)(nil),
	}
	want := strings.Join([]string{
		"first",
		"[image image/png 1234 bytes]",
		"[audio audio/wav 10 bytes]",
		"[image unknown 3 bytes]",
		"resource text",
		"[resource file:///a.bin application/pdf 5 bytes]",
		"[resource_link https://x.example/doc]",
		"[tool_result]\ninner",
	}, "\n")
	if got := FlattenText(content); got != want {
		t.Errorf("FlattenText =\n%s\nwant\n%s", got, want)
	}
	if got := FlattenText(nil); got != "" {
		t.Errorf("FlattenText(nil) = %q", got)
	}
}

func BenchmarkNormalizeContent(b *testing.B) {
	pngData, wavData := upstreamtest.PNGBytes(b), wavBytes()
	content := []mcp.Content{
		&mcp.TextContent{Text: "result text"},
		&mcp.ImageContent{Data: pngData, MIMEType: "image/jpeg"},
		&mcp.ImageContent{Data: pngData, MIMEType: "image/png"},
		&mcp.AudioContent{Data: wavData, MIMEType: "audio/mpeg"},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.md", MIMEType: "text/markdown", Text: "# A"}},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.bin", Blob: pngData}},
		&mcp.ResourceLink{URI: "https://x.example/a", Name: "a"},
	}
	b.ReportAllocs()
	for b.Loop() {
		NormalizeContent(content)
	}
}
