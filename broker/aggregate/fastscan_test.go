package aggregate

import (
	"encoding/json"
	"testing"
)

var resultSeeds = []string{
	`{"content":[{"type":"text","text":"caf\u00e9"}],"isError":false}`,
	`{"content":[],"structuredContent":{"type":"image"}}`,
	`{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}`,
	`{"content":[{"Type":"image"}],"isError":true}`,
	`{"Content":[],"content":[{"type":"text"}]}`,
	`{"content":[{"type":"text","type":"image"}]}`,
	`{"content":[{"t\u0079pe":"image"}]}`,
}

// FuzzScanTextResult: what scanTextResult reads of a tools/call result,
// normalizeFastResult's encoding/json decoding reads the same way, so the
// fast path normalizes exactly the results that path would.
func FuzzScanTextResult(f *testing.F) {
	for _, s := range resultSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, res []byte) {
		textOnly, isError, ok := scanTextResult(res)
		if !ok {
			return
		}
		var head struct {
			Content *[]struct {
				Type string `json:"type"`
			} `json:"content"`
			IsError bool `json:"isError"`
		}
		if err := json.Unmarshal(res, &head); err != nil || head.Content == nil {
			t.Fatalf("scanTextResult read %s, which encoding/json reads otherwise (%v)", res, err)
		}
		want := true
		for _, b := range *head.Content {
			want = want && b.Type == "text"
		}
		if textOnly != want || isError != head.IsError {
			t.Fatalf("scanTextResult(%s) = text-only %v, isError %v; encoding/json: %v, %v", res, textOnly, isError, want, head.IsError)
		}
	})
}
