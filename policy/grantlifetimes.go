package policy

import "time"

// CheckGrantLifetimes refuses an access and a refresh lifetime (zero:
// the defaults) that CreateGrant would refuse, so that a configuration
// giving them is refused when it loads rather than at a person's first
// sign-in. It runs CreateGrant's own check, on a spec whose other fields
// are good, so that there is one rule.
func CheckGrantLifetimes(access, refresh time.Duration) error {
	spec := GrantSpec{Owner: "lifetimes", Client: "lifetimes", Resource: "https://lifetimes.invalid/mcp",
		Scopes: []string{"lifetimes"}, AccessTTL: access, RefreshTTL: refresh}
	return checkGrantSpec(&spec)
}

// CheckGrantResource refuses a resource URL that CreateGrant would refuse
// to record, for the same reason: a site whose resource it is is refused
// when the configuration loads, rather than at each code's redemption.
func CheckGrantResource(resource string) error { return checkResource(resource) }
