package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// NormalizeContent returns upstream content blocks as the broker passes
// them on:
//
//   - text blocks, text resources and resource links are kept as they are;
//   - an image or audio block gets the media type its bytes show
//     ([MediaType]), the declared one serving only when the bytes say
//     nothing; an image block whose bytes are audio becomes an audio block,
//     and the other way round;
//   - a blob resource gets its media type the same way;
//   - any other block (tool_use and tool_result belong to sampling, not to
//     results) becomes a text block holding its JSON;
//   - nil blocks are dropped.
//
// Blocks are never changed in place: a repaired block is a copy, so content
// shared with a cache or another caller stays as it was.
func NormalizeContent(content []mcp.Content) []mcp.Content {
	out := make([]mcp.Content, 0, len(content))
	for _, c := range content {
		if n := normalizeBlock(c); n != nil {
			out = append(out, n)
		}
	}
	return out
}

func normalizeBlock(c mcp.Content) mcp.Content {
	switch b := c.(type) {
	case nil:
		return nil
	case *mcp.TextContent:
		if b == nil {
			return nil
		}
		return b
	case *mcp.ResourceLink:
		if b == nil {
			return nil
		}
		return b
	case *mcp.ImageContent:
		if b == nil {
			return nil
		}
		mt := MediaType(b.Data, b.MIMEType)
		if topLevel(mt) == "audio" {
			return &mcp.AudioContent{Data: b.Data, MIMEType: mt, Meta: b.Meta, Annotations: b.Annotations}
		}
		if mt == b.MIMEType {
			return b
		}
		n := *b
		n.MIMEType = mt
		return &n
	case *mcp.AudioContent:
		if b == nil {
			return nil
		}
		mt := MediaType(b.Data, b.MIMEType)
		if topLevel(mt) == "image" {
			return &mcp.ImageContent{Data: b.Data, MIMEType: mt, Meta: b.Meta, Annotations: b.Annotations}
		}
		if mt == b.MIMEType {
			return b
		}
		n := *b
		n.MIMEType = mt
		return &n
	case *mcp.EmbeddedResource:
		if b == nil {
			return nil
		}
		if b.Resource == nil || len(b.Resource.Blob) == 0 {
			return b
		}
		mt := MediaType(b.Resource.Blob, b.Resource.MIMEType)
		if mt == b.Resource.MIMEType {
			return b
		}
		r := *b.Resource
		r.MIMEType = mt
		n := *b
		n.Resource = &r
		return &n
	}
	return jsonText(c)
}

// jsonText turns a block the broker does not pass on as it is into a text
// block holding its JSON. A block that cannot be marshaled (a typed nil
// among them) is dropped.
func jsonText(c mcp.Content) (out mcp.Content) {
	defer func() {
		if recover() != nil {
			out = nil
		}
	}()
	data, err := c.MarshalJSON()
	if err != nil {
		return &mcp.TextContent{Text: fmt.Sprintf("[content block that could not be encoded: %v]", err)}
	}
	return &mcp.TextContent{Text: string(data)}
}

// passedTypes are the content types that [DecodeContent] hands to the SDK.
var passedTypes = map[string]bool{"text": true, "image": true, "audio": true, "resource_link": true, "resource": true}

// DecodeContent reads the "content" array of an upstream result (a single
// block is accepted too) without failing on block types the SDK does not
// know, such as those of a newer protocol version: each such block becomes
// a text block holding its JSON, as does a known block that does not decode
// (bad base64, say). The result is normalized ([NormalizeContent]). Only
// JSON that is not an array or object of blocks is an error.
func DecodeContent(raw []byte) ([]mcp.Content, error) {
	raw = bytes.TrimSpace(raw)
	var blocks []json.RawMessage
	switch {
	case isKind(raw, '['):
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return nil, fmt.Errorf("content: %w", err)
		}
	case isKind(raw, '{'):
		blocks = []json.RawMessage{raw}
	default:
		return nil, fmt.Errorf("content: want a JSON array of content blocks")
	}
	out := make([]mcp.Content, 0, len(blocks))
	for _, block := range blocks {
		out = append(out, decodeBlock(block))
	}
	return NormalizeContent(out), nil
}

func decodeBlock(block json.RawMessage) mcp.Content {
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(block, &head); err == nil && passedTypes[head.Type] {
		var res mcp.CallToolResult
		wrapped := make([]byte, 0, len(block)+16)
		wrapped = append(append(append(wrapped, `{"content":[`...), block...), "]}"...)
		if err := json.Unmarshal(wrapped, &res); err == nil && len(res.Content) == 1 {
			return res.Content[0]
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, block); err != nil {
		return &mcp.TextContent{Text: string(block)}
	}
	return &mcp.TextContent{Text: compact.String()}
}

// FlattenText is the text form of content used in logs: text blocks and
// text resources as they are, every other block as a short placeholder such
// as "[image image/png 1234 bytes]" (never its data), one block per line.
func FlattenText(content []mcp.Content) string {
	var b strings.Builder
	first := true
	for _, c := range content {
		if isNilContent(c) {
			continue
		}
		if !first {
			b.WriteByte('\n')
		}
		first = false
		flattenBlock(&b, c)
	}
	return b.String()
}

func isNilContent(c mcp.Content) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func flattenBlock(b *strings.Builder, c mcp.Content) {
	switch x := c.(type) {
	case *mcp.TextContent:
		b.WriteString(x.Text)
	case *mcp.ImageContent:
		writeMedia(b, "image", x.MIMEType, len(x.Data))
	case *mcp.AudioContent:
		writeMedia(b, "audio", x.MIMEType, len(x.Data))
	case *mcp.ResourceLink:
		b.WriteString("[resource_link " + x.URI + "]")
	case *mcp.EmbeddedResource:
		switch {
		case x.Resource == nil:
			b.WriteString("[resource]")
		case len(x.Resource.Blob) > 0:
			b.WriteString("[resource " + x.Resource.URI + " ")
			writeMediaTail(b, x.Resource.MIMEType, len(x.Resource.Blob))
		default:
			b.WriteString(x.Resource.Text)
		}
	//lint:ignore SA1019 sampling blocks may still arrive from an upstream that misuses them; flatten them without their data.
	case *mcp.ToolUseContent:
		b.WriteString("[tool_use " + x.Name + "]")
	//lint:ignore SA1019 as above.
	case *mcp.ToolResultContent:
		b.WriteString("[tool_result]")
		if inner := FlattenText(x.Content); inner != "" {
			b.WriteString("\n" + inner)
		}
	default:
		if t, ok := jsonText(c).(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
}

func writeMedia(b *strings.Builder, kind, mediaType string, n int) {
	b.WriteString("[" + kind + " ")
	writeMediaTail(b, mediaType, n)
}

func writeMediaTail(b *strings.Builder, mediaType string, n int) {
	if mediaType == "" {
		mediaType = "unknown"
	}
	b.WriteString(mediaType)
	b.WriteByte(' ')
	b.WriteString(strconv.Itoa(n))
	b.WriteString(" bytes]")
}

// MediaType returns the media type of data: what its bytes show first
// (net/http's sniffing, plus checks for WAV, MP3, AAC, Ogg, FLAC, M4A,
// WebP, AVIF, HEIC and SVG), and declared when the bytes say nothing more
// than application/octet-stream or text/plain. The declared type is also
// kept when it refines what the bytes show: an application/* type for a
// ZIP container (docx, epub), a +xml type for XML, a text/* type for HTML,
// and audio/mp4 or audio/webm for what net/http calls video/mp4 or
// video/webm. With no data, declared is returned unchanged.
func MediaType(data []byte, declared string) string {
	if len(data) == 0 {
		return declared
	}
	sniffed := sniffMediaType(data)
	base, decl := baseType(sniffed), baseType(declared)
	switch {
	case base == "application/octet-stream" || base == "text/plain":
		if decl != "" {
			return declared
		}
		return sniffed
	case decl == "":
		return sniffed
	case decl == base || refines(decl, base):
		return declared
	}
	return sniffed
}

// refines reports whether a declared type says more about data than the
// sniffed type does, without contradicting it.
func refines(decl, sniffed string) bool {
	switch sniffed {
	case "application/zip":
		return strings.HasPrefix(decl, "application/") && decl != "application/octet-stream"
	case "text/xml":
		return strings.HasSuffix(decl, "+xml") || decl == "application/xml"
	case "text/html":
		return topLevel(decl) == "text"
	case "video/mp4", "video/webm":
		// net/http names these containers video/ whatever they hold.
		_, sub, _ := strings.Cut(sniffed, "/")
		return decl == "audio/"+sub
	}
	return false
}

// sniffMediaType checks the formats net/http misses or names unusually,
// then asks net/http.
func sniffMediaType(data []byte) string {
	switch {
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WAVE":
		return "audio/wav"
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		return "image/webp"
	case bytes.HasPrefix(data, []byte("ID3")):
		return "audio/mpeg"
	case bytes.HasPrefix(data, []byte("OggS")):
		if bytes.Contains(data[:min(len(data), 128)], []byte("\x80theora")) {
			return "video/ogg"
		}
		return "audio/ogg"
	case bytes.HasPrefix(data, []byte("fLaC")):
		return "audio/flac"
	case len(data) >= 12 && string(data[4:8]) == "ftyp":
		switch string(data[8:12]) {
		case "M4A ", "M4B ", "M4P ":
			return "audio/mp4"
		case "avif", "avis":
			return "image/avif"
		case "heic", "heix", "heim", "heis":
			return "image/heic"
		case "mif1", "msf1":
			return "image/heif"
		}
	case len(data) >= 3 && data[0] == 0xFF && data[1]&0xE0 == 0xE0:
		if t := mpegFrame(data); t != "" {
			return t
		}
	case isSVG(data):
		return "image/svg+xml"
	}
	ct := http.DetectContentType(data)
	if ct == "audio/wave" {
		return "audio/wav"
	}
	return ct
}

// mpegFrame reads an MPEG audio frame header (MP3 without an ID3 tag) or
// an AAC ADTS header.
func mpegFrame(data []byte) string {
	version := (data[1] >> 3) & 3
	layer := (data[1] >> 1) & 3
	if layer == 0 {
		if data[1]&0xF6 == 0xF0 {
			return "audio/aac"
		}
		return ""
	}
	bitrate := data[2] >> 4
	rate := (data[2] >> 2) & 3
	if version == 1 || bitrate == 0xF || rate == 3 {
		return ""
	}
	return "audio/mpeg"
}

// isSVG reports an SVG document: <svg first, or after an XML declaration,
// comment or doctype, within the first kilobyte.
func isSVG(data []byte) bool {
	head := bytes.TrimPrefix(data[:min(len(data), 1024)], []byte("\xEF\xBB\xBF"))
	head = bytes.TrimLeft(head, " \t\r\n")
	switch {
	case bytes.HasPrefix(head, []byte("<svg")):
		return true
	case bytes.HasPrefix(head, []byte("<?xml")), bytes.HasPrefix(head, []byte("<!--")), bytes.HasPrefix(head, []byte("<!DOCTYPE svg")):
		return bytes.Contains(head, []byte("<svg"))
	}
	return false
}

// baseType is a media type without parameters, lowercased.
func baseType(mt string) string {
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = mt[:i]
	}
	return strings.ToLower(strings.TrimSpace(mt))
}

func topLevel(mt string) string {
	top, _, _ := strings.Cut(baseType(mt), "/")
	return top
}
