package cluster

import (
	"strings"
	"testing"
)

func TestCheckAdvertise(t *testing.T) {
	for _, ok := range []string{"https://gw-1.internal:8443", "https://10.0.0.2", "http://127.0.0.1:8080", "http://localhost:1", "http://[::1]:2/"} {
		if err := CheckAdvertise(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"http://10.0.0.2:8080":          "in the clear",
		"gw-1:8443":                     "give the URL",
		"ftp://gw-1":                    "scheme",
		"https://":                      "give the URL",
		"https://user:pw@gw-1":          "no user",
		"https://gw-1/mcp":              "no user, path",
		"https://gw-1?x=1":              "no user, path or query",
		"https://0.0.0.0:8443":          "no address another replica can reach",
		"":                              "give the URL",
		"https://gw-1.internal:8443#no": "no user",
		// Spellings of loopback that pinnedfetch's rule refuses are not
		// loopback here either: one predicate for every plain-http rule.
		"http://[::ffff:127.0.0.1]:8080": "in the clear",
		"http://[::ffff:7f00:1]:8080":    "in the clear",
		"http://2130706433:8080":         "in the clear",
		"http://localhost.:8080":         "in the clear",
	} {
		err := CheckAdvertise(bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", bad, err, want)
		}
	}
}
