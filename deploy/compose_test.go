package deploy

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/kasa-pay/kasa/config"
)

// knownEnv is every KASA_* key kasa reads from its environment (config.EnvVars). A key outside
// it in docker-compose.yml is a typo that kasa would silently ignore.
var knownEnv = config.EnvVars()

// kasaServices maps each compose service that runs the kasa binary to its subcommand.
var kasaServices = map[string]string{
	"migrate": "migrate",
	"banksim": "banksim",
	"worker":  "worker",
	"api":     "api",
	"relay":   "relay",
}

// testVars stands in for the operator's shell when the test interpolates ${VAR} references.
var testVars = map[string]string{
	"KASA_SECRET_KEY":  strings.Repeat("ab", 32),
	"KASA_ADMIN_TOKEN": "test-admin-token",
}

// repoRoot is the repository root, found from this file's location rather than the working directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok, "runtime.Caller failed")
	return filepath.Join(filepath.Dir(file), "..")
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), name))
	require.NoError(t, err)
	return string(b)
}

type compose struct {
	raw      string
	doc      map[string]any
	services map[string]map[string]any
}

// loadCompose parses docker-compose.yml. yaml.v3 resolves anchors, aliases and `<<` merge keys
// itself while decoding, so the maps below are what docker compose sees before interpolation.
func loadCompose(t *testing.T) compose {
	t.Helper()
	raw := readRepoFile(t, "docker-compose.yml")
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(raw), &doc), "docker-compose.yml is not valid YAML")
	svcs, ok := doc["services"].(map[string]any)
	require.True(t, ok, "docker-compose.yml has no services mapping")
	c := compose{raw: raw, doc: doc, services: map[string]map[string]any{}}
	for name, v := range svcs {
		m, ok := v.(map[string]any)
		require.Truef(t, ok, "service %s is not a mapping", name)
		c.services[name] = m
	}
	return c
}

func (c compose) service(t *testing.T, name string) map[string]any {
	t.Helper()
	s, ok := c.services[name]
	require.Truef(t, ok, "service %q missing from docker-compose.yml", name)
	return s
}

// env returns a service's environment (map or list form) with values as written in the file.
func (c compose) env(t *testing.T, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch e := c.service(t, name)["environment"].(type) {
	case nil:
	case map[string]any:
		for k, v := range e {
			if v == nil {
				out[k] = ""
				continue
			}
			out[k] = fmt.Sprint(v)
		}
	case []any:
		for _, item := range e {
			k, v, _ := strings.Cut(fmt.Sprint(item), "=")
			out[k] = v
		}
	default:
		t.Fatalf("service %s: environment has unexpected type %T", name, e)
	}
	return out
}

// resolvedEnv is env with ${VAR} references interpolated as docker compose would, using testVars.
func (c compose) resolvedEnv(t *testing.T, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range c.env(t, name) {
		r, err := interpolate(v, testVars)
		require.NoErrorf(t, err, "service %s: %s", name, k)
		out[k] = r
	}
	return out
}

// command returns the service's command as a list of arguments.
func (c compose) command(t *testing.T, name string) []string {
	t.Helper()
	switch cmd := c.service(t, name)["command"].(type) {
	case string:
		return strings.Fields(cmd)
	case []any:
		out := make([]string, len(cmd))
		for i, a := range cmd {
			out[i] = fmt.Sprint(a)
		}
		return out
	case nil:
		return nil
	default:
		t.Fatalf("service %s: command has unexpected type %T", name, cmd)
		return nil
	}
}

type port struct {
	hostIP    string
	published string
	target    string
}

// ports returns the service's published ports, short ("[ip:]host:container[/proto]") or long syntax.
func (c compose) ports(t *testing.T, name string) []port {
	t.Helper()
	list, _ := c.service(t, name)["ports"].([]any)
	var out []port
	for _, p := range list {
		switch p := p.(type) {
		case string:
			s, err := interpolate(p, testVars)
			require.NoError(t, err)
			s, _, _ = strings.Cut(s, "/")
			parts := strings.Split(s, ":")
			switch len(parts) {
			case 1:
				out = append(out, port{target: parts[0]})
			case 2:
				out = append(out, port{published: parts[0], target: parts[1]})
			default:
				n := len(parts)
				out = append(out, port{hostIP: strings.Join(parts[:n-2], ":"), published: parts[n-2], target: parts[n-1]})
			}
		case int:
			out = append(out, port{target: fmt.Sprint(p)})
		case map[string]any:
			pp := port{target: fmt.Sprint(p["target"])}
			if v, ok := p["published"]; ok {
				pp.published = fmt.Sprint(v)
			}
			if v, ok := p["host_ip"]; ok {
				pp.hostIP = fmt.Sprint(v)
			}
			out = append(out, pp)
		default:
			t.Fatalf("service %s: port entry has unexpected type %T", name, p)
		}
	}
	return out
}

func (c compose) publishes(t *testing.T, name, published string) (port, bool) {
	t.Helper()
	for _, p := range c.ports(t, name) {
		if p.published == published {
			return p, true
		}
	}
	return port{}, false
}

// dependsOn returns the service's depends_on as service -> condition (short form means service_started).
func (c compose) dependsOn(t *testing.T, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch d := c.service(t, name)["depends_on"].(type) {
	case nil:
	case []any:
		for _, s := range d {
			out[fmt.Sprint(s)] = "service_started"
		}
	case map[string]any:
		for s, v := range d {
			cond := "service_started"
			if m, ok := v.(map[string]any); ok && m["condition"] != nil {
				cond = fmt.Sprint(m["condition"])
			}
			out[s] = cond
		}
	default:
		t.Fatalf("service %s: depends_on has unexpected type %T", name, d)
	}
	return out
}

func hostPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	require.NoErrorf(t, err, "address %q", addr)
	return h, p
}

func TestComposeServicesExist(t *testing.T) {
	c := loadCompose(t)
	_, hasVersion := c.doc["version"]
	require.False(t, hasVersion, "the compose spec has no top-level version key")
	for _, name := range []string{"postgres", "temporal", "migrate", "banksim", "worker", "api", "nats", "relay"} {
		t.Run(name, func(t *testing.T) {
			c.service(t, name)
		})
	}
}

func TestComposeKasaServicesRunTheRepoImage(t *testing.T) {
	c := loadCompose(t)
	images := map[string]bool{}
	for name, sub := range kasaServices {
		t.Run(name, func(t *testing.T) {
			s := c.service(t, name)
			build, ok := s["build"].(map[string]any)
			require.Truef(t, ok, "%s must build from the repository (build: {context: ., dockerfile: Dockerfile})", name)
			require.Equal(t, ".", build["context"], "build context is the repository root")
			if df, ok := build["dockerfile"]; ok {
				require.Equal(t, "Dockerfile", df)
			}
			img, ok := s["image"].(string)
			require.True(t, ok, "kasa services tag the shared image so it is built once")
			images[img] = true
			require.Equal(t, []string{sub}, c.command(t, name), "subcommand of %s", name)
			_, hasEntrypoint := s["entrypoint"]
			require.False(t, hasEntrypoint, "the image's ENTRYPOINT /kasa must not be overridden")
		})
	}
	require.Len(t, images, 1, "every kasa service uses one image: %v", images)
}

func TestComposePublishedPorts(t *testing.T) {
	c := loadCompose(t)
	tests := []struct {
		service, port string
		required      bool
	}{
		{"api", "8080", true},
		{"banksim", "8090", true},
		{"temporal", "7233", true},
		{"temporal", "8233", true},
		{"postgres", "5432", false},
	}
	for _, tt := range tests {
		t.Run(tt.service+"/"+tt.port, func(t *testing.T) {
			p, ok := c.publishes(t, tt.service, tt.port)
			if !ok {
				require.Falsef(t, tt.required, "%s must publish port %s", tt.service, tt.port)
				return
			}
			require.Equal(t, tt.port, p.target, "published and container port differ")
			if p.hostIP != "" {
				require.NotNil(t, net.ParseIP(strings.Trim(p.hostIP, "[]")), "host ip %q", p.hostIP)
			}
		})
	}
}

func TestComposeEnvKeysAreKnown(t *testing.T) {
	c := loadCompose(t)
	for name := range kasaServices {
		t.Run(name, func(t *testing.T) {
			for k := range c.env(t, name) {
				if strings.HasPrefix(k, "KASA_") {
					require.Containsf(t, knownEnv, k, "service %s sets %s, which kasa does not read (typo?)", name, k)
				}
			}
		})
	}
}

func TestComposeSharedEnv(t *testing.T) {
	c := loadCompose(t)
	tests := []struct {
		key      string
		services []string
	}{
		{"KASA_DATABASE_URL", []string{"migrate", "worker", "api"}},
		{"KASA_TEMPORAL_ADDRESS", []string{"worker", "api"}},
		{"KASA_TEMPORAL_NAMESPACE", []string{"worker", "api"}},
		{"KASA_SECRET_KEY", []string{"worker", "api"}},
		{"KASA_PROVIDER_CAPABILITY", []string{"banksim", "worker", "api"}},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			first := tt.services[0]
			want, ok := c.env(t, first)[tt.key]
			require.Truef(t, ok, "%s does not set %s", first, tt.key)
			require.NotEmpty(t, want)
			for _, s := range tt.services[1:] {
				got, ok := c.env(t, s)[tt.key]
				require.Truef(t, ok, "%s does not set %s", s, tt.key)
				require.Equalf(t, want, got, "%s and %s must share %s", first, s, tt.key)
			}
		})
	}
}

func TestComposeAddresses(t *testing.T) {
	c := loadCompose(t)

	t.Run("database host is the postgres service", func(t *testing.T) {
		for _, s := range []string{"migrate", "worker", "api"} {
			u, err := url.Parse(c.resolvedEnv(t, s)["KASA_DATABASE_URL"])
			require.NoError(t, err)
			require.Contains(t, []string{"postgres", "postgresql"}, u.Scheme)
			require.Equal(t, "postgres", u.Hostname(), "%s: KASA_DATABASE_URL host", s)
			require.Equal(t, "5432", u.Port())
			require.Equal(t, "/"+fmt.Sprint(c.env(t, "postgres")["POSTGRES_DB"]), u.Path, "database name")
		}
	})

	t.Run("temporal address is the temporal service", func(t *testing.T) {
		for _, s := range []string{"worker", "api"} {
			h, p := hostPort(t, c.resolvedEnv(t, s)["KASA_TEMPORAL_ADDRESS"])
			require.Equal(t, "temporal", h, "%s: KASA_TEMPORAL_ADDRESS host", s)
			require.Equal(t, "7233", p)
		}
	})

	t.Run("worker calls the banksim service", func(t *testing.T) {
		u, err := url.Parse(c.resolvedEnv(t, "worker")["KASA_PROVIDER_URL"])
		require.NoError(t, err)
		require.Equal(t, "http", u.Scheme)
		require.Equal(t, "banksim", u.Hostname())
		_, simPort := hostPort(t, c.resolvedEnv(t, "banksim")["KASA_BANKSIM_ADDR"])
		require.Equal(t, simPort, u.Port(), "KASA_PROVIDER_URL port must be where banksim listens")
	})

	for _, tt := range []struct{ service, key, published string }{
		{"api", "KASA_API_ADDR", "8080"},
		{"banksim", "KASA_BANKSIM_ADDR", "8090"},
	} {
		t.Run(tt.service+" listens on all interfaces at its published port", func(t *testing.T) {
			h, p := hostPort(t, c.resolvedEnv(t, tt.service)[tt.key])
			require.Equal(t, "0.0.0.0", h, "%s inside a container must not listen on loopback", tt.key)
			pub, ok := c.publishes(t, tt.service, tt.published)
			require.True(t, ok)
			require.Equal(t, pub.target, p, "%s port and the published container port differ", tt.key)
		})
	}

	t.Run("provider capability is valid", func(t *testing.T) {
		require.Contains(t, []string{"idempotent", "inquiry", "none"}, c.resolvedEnv(t, "worker")["KASA_PROVIDER_CAPABILITY"])
	})
}

func TestComposeSecretsHaveNoDefault(t *testing.T) {
	c := loadCompose(t)
	for _, key := range []string{"KASA_SECRET_KEY", "KASA_ADMIN_TOKEN"} {
		t.Run(key, func(t *testing.T) {
			v := c.env(t, "api")[key]
			_, err := interpolate(v, map[string]string{})
			require.Errorf(t, err, "%s = %q must be a required ${%s:?...} variable, not a value committed to git", key, v, key)
			got, err := interpolate(v, testVars)
			require.NoError(t, err)
			require.Equal(t, testVars[key], got)
		})
	}
}

func TestComposeStartupOrder(t *testing.T) {
	c := loadCompose(t)
	tests := []struct {
		service, dependency, condition string
	}{
		{"migrate", "postgres", "service_healthy"},
		{"worker", "migrate", "service_completed_successfully"},
		{"worker", "temporal", ""},
		{"worker", "banksim", ""},
		{"api", "migrate", "service_completed_successfully"},
		{"api", "temporal", ""},
		{"api", "worker", ""},
	}
	for _, tt := range tests {
		t.Run(tt.service+" after "+tt.dependency, func(t *testing.T) {
			cond, ok := c.dependsOn(t, tt.service)[tt.dependency]
			require.Truef(t, ok, "%s must depend on %s", tt.service, tt.dependency)
			if tt.condition != "" {
				require.Equal(t, tt.condition, cond)
			}
		})
	}

	t.Run("conditions can be met", func(t *testing.T) {
		for name := range c.services {
			for dep, cond := range c.dependsOn(t, name) {
				d := c.service(t, dep)
				switch cond {
				case "service_healthy":
					require.NotNilf(t, d["healthcheck"], "%s waits for %s to be healthy, but it has no healthcheck", name, dep)
				case "service_completed_successfully":
					r, _ := d["restart"].(string)
					require.Containsf(t, []string{"", "no", "on-failure"}, r, "%s waits for %s to complete, so it must not restart %q", name, dep, r)
				case "service_started":
				default:
					t.Fatalf("%s: unknown depends_on condition %q", name, cond)
				}
			}
		}
	})

	t.Run("kasa images have no shell for healthchecks", func(t *testing.T) {
		for name := range kasaServices {
			hc, _ := c.service(t, name)["healthcheck"].(map[string]any)
			if test, ok := hc["test"].([]any); ok && len(test) > 0 {
				require.NotEqualf(t, "CMD-SHELL", test[0], "%s: the distroless image has no shell", name)
			}
		}
	})
}

func TestComposeTemporal(t *testing.T) {
	c := loadCompose(t)
	args := strings.Join(c.command(t, "temporal"), " ")
	for _, want := range []string{
		"server start-dev",
		"--ip 0.0.0.0",
		"--ui-ip 0.0.0.0",
		"--search-attribute PaymentStatus=Keyword",
		"--search-attribute MerchantId=Keyword",
		"--db-filename /data/",
	} {
		require.Contains(t, args, want)
	}
	require.Contains(t, c.service(t, "temporal")["volumes"], "temporal-data:/data", "the Temporal database must live on a volume")
}

func TestComposeVolumesAreDeclared(t *testing.T) {
	c := loadCompose(t)
	declared, _ := c.doc["volumes"].(map[string]any)
	for name, s := range c.services {
		vols, _ := s["volumes"].([]any)
		for _, v := range vols {
			src, _, _ := strings.Cut(fmt.Sprint(v), ":")
			if m, ok := v.(map[string]any); ok {
				src = fmt.Sprint(m["source"])
			}
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") || strings.HasPrefix(src, "~") {
				continue // bind mount
			}
			_, ok := declared[src]
			require.Truef(t, ok, "service %s mounts volume %q, which is not declared under volumes:", name, src)
		}
	}
	require.Contains(t, c.service(t, "banksim")["volumes"], "banksim-data:"+c.env(t, "banksim")["KASA_DATA_DIR"],
		"the simulator's charge log (KASA_DATA_DIR) must survive a restart")
}

var (
	// interpolation references: $VAR or ${VAR...}; "$$" is an escaped dollar and removed first.
	varRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)
	// documented variables: "#   NAME  required|optional ..." in the leading comment block.
	documentedVar = regexp.MustCompile(`^#\s+([A-Za-z_][A-Za-z0-9_]*)\s+(required|optional)\b`)
)

func TestComposeVariablesAreDocumented(t *testing.T) {
	c := loadCompose(t)

	documented := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(c.raw))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			break // end of the header
		}
		if m := documentedVar.FindStringSubmatch(line); m != nil {
			documented[m[1]] = true
		}
	}
	require.NotEmpty(t, documented, "docker-compose.yml must document its variables in its header")

	used := map[string][]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		case string:
			for _, m := range varRef.FindAllStringSubmatch(strings.ReplaceAll(v, "$$", ""), -1) {
				used[m[1]] = append(used[m[1]], path)
			}
		}
	}
	walk("", c.doc)

	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	require.NotEmpty(t, names)
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			require.Truef(t, documented[n], "${%s} is used at %v but not documented in the header of docker-compose.yml", n, used[n])
		})
	}
}

func TestDockerfile(t *testing.T) {
	df := readRepoFile(t, "Dockerfile")
	// Join continuation lines and drop comments so each instruction is one line.
	var instrs []string
	var cur strings.Builder
	for _, line := range strings.Split(df, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		if s := strings.TrimSpace(cur.String()); s != "" {
			instrs = append(instrs, s)
		}
		cur.Reset()
	}

	var froms []string
	lastStage := 0
	for i, in := range instrs {
		if strings.HasPrefix(strings.ToUpper(in), "FROM ") {
			froms = append(froms, in)
			lastStage = i
		}
	}
	require.GreaterOrEqual(t, len(froms), 2, "multi-stage build expected")
	require.Regexp(t, `^FROM golang:1\.26\S* AS \S+`, froms[0])

	builds := slices.IndexFunc(instrs, func(in string) bool {
		return strings.HasPrefix(in, "RUN ") && regexp.MustCompile(`go build .*-o /out/kasa \./cmd/kasa(\s|$)`).MatchString(in)
	})
	require.GreaterOrEqual(t, builds, 0, "the builder must run go build -o /out/kasa ./cmd/kasa")
	require.Regexp(t, `CGO_ENABLED=0`, df)

	final := instrs[lastStage:]
	require.Regexp(t, `^FROM (gcr\.io/distroless/static-debian12:nonroot|debian:bookworm-slim)$`, final[0])
	require.Contains(t, final, `COPY --from=build /out/kasa /kasa`)
	require.Equal(t, `ENTRYPOINT ["/kasa"]`, final[len(final)-1])

	ignore := strings.Fields(readRepoFile(t, ".dockerignore"))
	for _, must := range []string{".git", ".env", ".data", "bin"} {
		require.Containsf(t, ignore, must, ".dockerignore must exclude %s (secrets, state or large binaries)", must)
	}
	for _, mustNot := range []string{"go.mod", "go.sum", "cmd", "*.go", "."} {
		require.NotContainsf(t, ignore, mustNot, ".dockerignore excludes %s, which the build needs", mustNot)
	}
}

// interpolate expands $VAR and ${VAR[:-|-|:?|?|:+|+]word} as docker compose does; "$$" is a literal "$".
func interpolate(s string, vars map[string]string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			i++
			continue
		}
		switch next := s[i+1]; {
		case next == '$':
			b.WriteByte('$')
			i += 2
		case next == '{':
			depth, j := 1, i+2
			for ; j < len(s) && depth > 0; j++ {
				switch s[j] {
				case '{':
					depth++
				case '}':
					depth--
				}
			}
			if depth != 0 {
				return "", fmt.Errorf("unterminated ${ in %q", s)
			}
			v, err := expandBraced(s[i+2:j-1], vars)
			if err != nil {
				return "", err
			}
			b.WriteString(v)
			i = j
		case next == '_' || next >= 'A' && next <= 'Z' || next >= 'a' && next <= 'z':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			b.WriteString(vars[s[i+1:j]])
			i = j
		default:
			b.WriteByte('$')
			i++
		}
	}
	return b.String(), nil
}

func expandBraced(expr string, vars map[string]string) (string, error) {
	n := 0
	for n < len(expr) && (expr[n] == '_' || expr[n] >= 'A' && expr[n] <= 'Z' || expr[n] >= 'a' && expr[n] <= 'z' || n > 0 && expr[n] >= '0' && expr[n] <= '9') {
		n++
	}
	if n == 0 {
		return "", fmt.Errorf("invalid interpolation ${%s}", expr)
	}
	name, rest := expr[:n], expr[n:]
	val, set := vars[name]
	op := ""
	for _, o := range []string{":-", ":?", ":+", "-", "?", "+"} {
		if strings.HasPrefix(rest, o) {
			op = o
			break
		}
	}
	if op == "" && rest != "" {
		return "", fmt.Errorf("invalid interpolation ${%s}", expr)
	}
	word := rest[len(op):]
	switch op {
	case "":
		return val, nil
	case ":-":
		if val == "" {
			return interpolate(word, vars)
		}
	case "-":
		if !set {
			return interpolate(word, vars)
		}
	case ":?":
		if val == "" {
			return "", fmt.Errorf("required variable %s is missing a value: %s", name, word)
		}
	case "?":
		if !set {
			return "", fmt.Errorf("required variable %s is missing a value: %s", name, word)
		}
	case ":+":
		if val != "" {
			return interpolate(word, vars)
		}
		return "", nil
	case "+":
		if set {
			return interpolate(word, vars)
		}
		return "", nil
	}
	return val, nil
}

func TestInterpolate(t *testing.T) {
	vars := map[string]string{"SET": "v", "EMPTY": ""}
	tests := []struct {
		in, want string
		err      bool
	}{
		{"plain", "plain", false},
		{"$$SET", "$SET", false},
		{"$SET/${SET}", "v/v", false},
		{"${UNSET:-d}", "d", false},
		{"${EMPTY:-d}", "d", false},
		{"${EMPTY-d}", "", false},
		{"${UNSET-${SET}}", "v", false},
		{"${SET:?boom}", "v", false},
		{"${EMPTY:?boom}", "", true},
		{"${UNSET?boom}", "", true},
		{"${SET:+alt}", "alt", false},
		{"${UNSET:+alt}", "", false},
		{"${SET", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := interpolate(tt.in, vars)
			if tt.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
