package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// knownEnv is every KASA_* key kasa reads from its environment (config.EnvVars). A key outside
// it in docker-compose.yml is a typo that kasa would silently ignore.
var knownEnv = config.EnvVars()

// kasaServices maps each compose service that runs the kasa binary to its subcommand.
var kasaServices = map[string]string{
	"migrate":  "migrate",
	"banksim":  "banksim",
	"worker-1": "worker",
	"worker-2": "worker",
	"api-1":    "api",
	"api-2":    "api",
	"relay":    "relay",
}

// instances lists the compose services running the kasa subcommand sub, sorted.
func instances(sub string) []string {
	var out []string
	for name, s := range kasaServices {
		if s == sub {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// appServices are the kasa services that use the database as the application role.
var appServices = []string{"api-1", "api-2", "worker-1", "worker-2", "relay"}

// testVars stands in for the operator's shell when the test interpolates ${VAR} references.
var testVars = map[string]string{
	"KASA_SECRET_KEY":           strings.Repeat("ab", 32),
	"KASA_ADMIN_TOKEN":          "test-admin-token",
	"KASA_POSTGRES_PASSWORD":    "pgsuperpw1",
	"KASA_DB_OWNER_PASSWORD":    "ownerpw2",
	"KASA_DB_APP_PASSWORD":      "apppw3",
	"KASA_TEMPORAL_DB_PASSWORD": "temporalpw4",
	"KASA_UI_PASSWORD":          "uipw5",
	"KASA_GRAFANA_PASSWORD":     "grafanapw6",
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
	for _, name := range []string{
		"postgres", "temporal-schema", "temporal", "temporal-setup", "temporal-ui",
		"migrate", "banksim", "worker-1", "worker-2", "api-1", "api-2", "nats", "relay", "prometheus", "grafana",
	} {
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
			// The simulator is a developer tool: only the Dockerfile's tools target carries it.
			if sub == "banksim" {
				require.Equal(t, "tools", build["target"], "the production image has no banksim")
			} else {
				require.Nil(t, build["target"], "%s runs the production image (the Dockerfile's last stage)", name)
				images[img] = true
			}
			require.Equal(t, []string{sub}, c.command(t, name), "subcommand of %s", name)
			_, hasEntrypoint := s["entrypoint"]
			require.False(t, hasEntrypoint, "the image's ENTRYPOINT /kasa must not be overridden")
		})
	}
	require.Len(t, images, 1, "every production kasa service uses one image: %v", images)
}

// Several instances of each long-running kasa process, as a production deployment runs them.
func TestComposeRunsTwoOfEach(t *testing.T) {
	c := loadCompose(t)
	for _, sub := range []string{"api", "worker"} {
		t.Run(sub, func(t *testing.T) {
			names := instances(sub)
			require.Len(t, names, 2, "two %s instances", sub)
			for _, name := range names {
				require.Equal(t, []string{sub}, c.command(t, name))
				_, replicated := c.service(t, name)["deploy"]
				require.Falsef(t, replicated, "%s: one named service per instance, so Prometheus scrapes each", name)
			}
		})
	}
}

func TestComposePublishedPorts(t *testing.T) {
	c := loadCompose(t)
	tests := []struct {
		service, port string
		required      bool
	}{
		{"api-1", "8080", true},
		{"api-2", "8081", true},
		{"banksim", "8090", true},
		{"temporal", "7233", true},
		{"temporal-ui-proxy", "8233", true},
		{"prometheus", "9090", true},
		{"grafana", "3000", true},
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

// The APIs serve /metrics on an address of their own that compose does not publish: a scrape
// shows the business's figures and runs database queries, so only Prometheus reaches it.
func TestComposeMetricsAreNotPublished(t *testing.T) {
	c := loadCompose(t)
	for _, s := range instances("api") {
		_, apiPort := hostPort(t, c.resolvedEnv(t, s)["KASA_API_ADDR"])
		_, metricsPort := hostPort(t, c.resolvedEnv(t, s)["KASA_METRICS_ADDR"])
		require.NotEqual(t, apiPort, metricsPort, s)
		for _, p := range c.ports(t, s) {
			require.NotEqualf(t, metricsPort, p.target, "%s publishes its metrics port", s)
		}
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
		only     bool // and no other service gets it: least privilege for a credential
	}{
		{"KASA_DATABASE_URL", append([]string{"migrate"}, appServices...), false},
		{"KASA_TEMPORAL_ADDRESS", []string{"migrate", "worker-1", "worker-2", "api-1", "api-2"}, false},
		{"KASA_TEMPORAL_NAMESPACE", []string{"migrate", "worker-1", "worker-2", "api-1", "api-2"}, false},
		{"KASA_SECRET_KEY", []string{"worker-1", "worker-2", "api-1", "api-2", "relay"}, false},
		// Only the API reads the admin token (docs/deployment.md, "The processes").
		{"KASA_ADMIN_TOKEN", []string{"api-1", "api-2"}, true},
		{"KASA_PROVIDER_CAPABILITY", []string{"banksim", "worker-1", "worker-2", "api-1", "api-2"}, false},
		{"KASA_PROVIDER_URL", []string{"worker-1", "worker-2"}, true},
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
			if !tt.only {
				return
			}
			for name := range c.services {
				if !slices.Contains(tt.services, name) {
					_, ok := c.env(t, name)[tt.key]
					require.Falsef(t, ok, "%s gets %s, which only %v need", name, tt.key, tt.services)
				}
			}
		})
	}
}

func TestComposeAddresses(t *testing.T) {
	c := loadCompose(t)

	t.Run("database host is the postgres service", func(t *testing.T) {
		for _, s := range append([]string{"migrate"}, appServices...) {
			u, err := url.Parse(c.resolvedEnv(t, s)["KASA_DATABASE_URL"])
			require.NoError(t, err)
			require.Contains(t, []string{"postgres", "postgresql"}, u.Scheme)
			require.Equal(t, "postgres", u.Hostname(), "%s: KASA_DATABASE_URL host", s)
			require.Equal(t, "5432", u.Port())
			require.Equal(t, "/"+fmt.Sprint(c.env(t, "postgres")["POSTGRES_DB"]), u.Path, "database name")
		}
	})

	t.Run("temporal address is the temporal service", func(t *testing.T) {
		for _, s := range []string{"migrate", "worker-1", "worker-2", "api-1", "api-2"} {
			h, p := hostPort(t, c.resolvedEnv(t, s)["KASA_TEMPORAL_ADDRESS"])
			require.Equal(t, "temporal", h, "%s: KASA_TEMPORAL_ADDRESS host", s)
			require.Equal(t, "7233", p)
		}
	})

	t.Run("worker calls the banksim service", func(t *testing.T) {
		u, err := url.Parse(c.resolvedEnv(t, "worker-1")["KASA_PROVIDER_URL"])
		require.NoError(t, err)
		require.Equal(t, "http", u.Scheme)
		require.Equal(t, "banksim", u.Hostname())
		_, simPort := hostPort(t, c.resolvedEnv(t, "banksim")["KASA_BANKSIM_ADDR"])
		require.Equal(t, simPort, u.Port(), "KASA_PROVIDER_URL port must be where banksim listens")
	})

	for _, tt := range []struct{ service, key, published string }{
		{"api-1", "KASA_API_ADDR", "8080"},
		{"api-2", "KASA_API_ADDR", "8081"},
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
		require.Contains(t, []string{"idempotent", "inquiry", "none"}, c.resolvedEnv(t, "worker-1")["KASA_PROVIDER_CAPABILITY"])
	})
}

func TestComposeSecretsHaveNoDefault(t *testing.T) {
	c := loadCompose(t)
	for _, key := range []string{"KASA_SECRET_KEY", "KASA_ADMIN_TOKEN"} {
		t.Run(key, func(t *testing.T) {
			v := c.env(t, "api-1")[key]
			_, err := interpolate(v, map[string]string{})
			require.Errorf(t, err, "%s = %q must be a required ${%s:?...} variable, not a value committed to git", key, v, key)
			got, err := interpolate(v, testVars)
			require.NoError(t, err)
			require.Equal(t, testVars[key], got)
		})
	}
}

// The rotations docs/deployment.md describes run on compose as written: every api, worker and
// relay (and migrate, which runs `kasa rotate-secret-key` as the owner) takes the replaced
// KASA_SECRET_KEY as KASA_SECRET_KEY_PREVIOUS, and the APIs the replaced admin token, from .env.
// Unset, they are empty: kasa reads an empty variable as unset.
func TestComposeTakesThePreviousKeyAndToken(t *testing.T) {
	c := loadCompose(t)
	for _, tc := range []struct {
		key      string
		services []string
	}{
		{"KASA_SECRET_KEY_PREVIOUS", append([]string{"migrate"}, appServices...)},
		{"KASA_ADMIN_TOKEN_PREVIOUS", []string{"api-1", "api-2"}},
	} {
		for _, name := range tc.services {
			t.Run(tc.key+"/"+name, func(t *testing.T) {
				v, ok := c.env(t, name)[tc.key]
				require.Truef(t, ok, "%s does not pass %s: the rotation in docs/deployment.md cannot be done on compose", name, tc.key)
				got, err := interpolate(v, map[string]string{})
				require.NoError(t, err, "optional: only set during a rotation")
				require.Empty(t, got)
				got, err = interpolate(v, map[string]string{tc.key: "the-old-one"})
				require.NoError(t, err)
				require.Equal(t, "the-old-one", got, "taken from .env or the shell")
			})
		}
	}
}

func TestComposeStartupOrder(t *testing.T) {
	c := loadCompose(t)
	tests := []struct {
		service, dependency, condition string
	}{
		{"temporal-schema", "postgres", "service_healthy"},
		{"temporal", "temporal-schema", "service_completed_successfully"},
		{"temporal-setup", "temporal", "service_healthy"},
		{"temporal-ui", "temporal", "service_healthy"},
		{"migrate", "postgres", "service_healthy"},
		// kasa migrate registers the search attributes when they are missing: the namespace must exist.
		{"migrate", "temporal-setup", "service_completed_successfully"},
		{"worker-1", "banksim", ""},
		{"worker-2", "banksim", ""},
		{"relay", "nats", ""},
		// /readyz waits for a worker polling the task queue.
		{"api-1", "worker-1", ""},
		{"api-2", "worker-2", ""},
	}
	// Every kasa process that uses the database starts only once migrate has brought it to its
	// schema (the bank simulator keeps its own files).
	for name := range kasaServices {
		if name != "migrate" && name != "banksim" {
			tests = append(tests, struct{ service, dependency, condition string }{name, "migrate", "service_completed_successfully"})
		}
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

// temporalVersion is the Temporal Server release compose runs: the server and the admin tools
// (whose schema files set the database up) must be the same release.
const temporalVersion = "1.29.1"

// image returns the service's image split into repository and tag.
func (c compose) image(t *testing.T, name string) (string, string) {
	t.Helper()
	img, ok := c.service(t, name)["image"].(string)
	require.Truef(t, ok, "service %s has no image", name)
	repo, tag, ok := strings.Cut(img, ":")
	require.Truef(t, ok, "service %s: pin the image's tag (%s)", name, img)
	return repo, tag
}

// script returns the shell script a one-shot service runs: the repository file it mounts and
// passes to sh.
func (c compose) script(t *testing.T, name string) string {
	t.Helper()
	s := c.service(t, name)
	ep, _ := s["entrypoint"].([]any)
	require.Equalf(t, []any{"/bin/sh"}, ep, "%s runs its script with sh", name)
	args := c.command(t, name)
	require.Lenf(t, args, 1, "%s: command is the script's path", name)
	for _, m := range c.mounts(t, name) {
		if m.target == args[0] {
			require.True(t, m.bind(), "%s: the script comes from the repository", name)
			return readRepoFile(t, m.source)
		}
	}
	t.Fatalf("%s runs %s, which it does not mount", name, args[0])
	return ""
}

// The real Temporal Server on PostgreSQL, not the CLI's dev server (SQLite, one process).
func TestComposeTemporal(t *testing.T) {
	c := loadCompose(t)
	pg := c.env(t, "postgres")

	repo, tag := c.image(t, "temporal")
	require.Equal(t, "temporalio/server", repo, "the multi-service server image, not the CLI's dev server")
	require.Equal(t, temporalVersion, tag)
	require.NotContains(t, strings.Join(c.command(t, "temporal"), " "), "start-dev")

	env := c.resolvedEnv(t, "temporal")
	t.Run("postgres persistence", func(t *testing.T) {
		require.Equal(t, "postgres12", env["DB"], "SQL persistence and visibility on PostgreSQL")
		require.Equal(t, "postgres", env["POSTGRES_SEEDS"], "the postgres service")
		require.Equal(t, "5432", env["DB_PORT"])
		require.NotEmpty(t, env["POSTGRES_USER"])
		require.NotEqual(t, pg["POSTGRES_USER"], env["POSTGRES_USER"], "Temporal logs in as its own role, not the superuser")
		require.NotEmpty(t, env["DBNAME"])
		require.NotEmpty(t, env["VISIBILITY_DBNAME"])
		require.NotEqual(t, env["DBNAME"], env["VISIBILITY_DBNAME"])
		for _, db := range []string{env["DBNAME"], env["VISIBILITY_DBNAME"]} {
			require.NotEqual(t, pg["POSTGRES_DB"], db, "Temporal's databases are not kasa's")
		}
		require.NotEmpty(t, env["NUM_HISTORY_SHARDS"], "the shard count is fixed when the cluster is created: choose it")
		require.NotContains(t, env, "ENABLE_ES", "SQL visibility")
	})

	t.Run("listens for the other containers", func(t *testing.T) {
		require.Equal(t, "0.0.0.0", env["BIND_ON_IP"])
		_, ok := c.publishes(t, "temporal", "7233")
		require.True(t, ok)
	})

	t.Run("dynamic config", func(t *testing.T) {
		m := c.mountOf(t, "temporal", "./deploy/temporal-dynamicconfig.yaml")
		require.Equal(t, m.target, env["DYNAMIC_CONFIG_FILE_PATH"], "the server must read the mounted file")
		var dc map[string][]struct {
			Value       any            `yaml:"value"`
			Constraints map[string]any `yaml:"constraints"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(readRepoFile(t, "deploy/temporal-dynamicconfig.yaml")), &dc))
		value := func(key string) any {
			require.Containsf(t, dc, key, "deploy/temporal-dynamicconfig.yaml must set %s", key)
			require.Lenf(t, dc[key], 1, "%s: one value, for every namespace", key)
			require.Emptyf(t, dc[key][0].Constraints, "%s: no constraints", key)
			return dc[key][0].Value
		}
		n, ok := value("limit.maxIDLength").(int)
		require.True(t, ok, "limit.maxIDLength is a number")
		require.GreaterOrEqual(t, n, 255, "kasa's workflow ids are longer than the default limit")
		require.Equal(t, true, value("system.enableEagerWorkflowStart"))
	})

	t.Run("healthcheck asks the frontend", func(t *testing.T) {
		hc, _ := c.service(t, "temporal")["healthcheck"].(map[string]any)
		test := fmt.Sprint(hc["test"])
		require.Contains(t, test, "operator cluster health")
	})

	t.Run("metrics", func(t *testing.T) {
		h, _ := hostPort(t, env["PROMETHEUS_ENDPOINT"])
		require.Equal(t, "0.0.0.0", h, "Prometheus scrapes the server's own metrics from another container")
	})
}

// The schema tool of the same release creates and upgrades both of Temporal's databases.
func TestComposeTemporalSchema(t *testing.T) {
	c := loadCompose(t)
	repo, tag := c.image(t, "temporal-schema")
	require.Equal(t, "temporalio/admin-tools", repo)
	require.True(t, strings.HasPrefix(tag, temporalVersion+"-") || tag == temporalVersion,
		"admin-tools %s: its schema files must be the server's release %s", tag, temporalVersion)
	r, _ := c.service(t, "temporal-schema")["restart"].(string)
	require.Contains(t, []string{"", "no"}, r, "a one-shot service")

	server := c.resolvedEnv(t, "temporal")
	env := c.resolvedEnv(t, "temporal-schema")
	require.Equal(t, "postgres12", env["SQL_PLUGIN"])
	require.Equal(t, server["POSTGRES_SEEDS"], env["SQL_HOST"])
	require.Equal(t, server["DB_PORT"], env["SQL_PORT"])
	require.Equal(t, server["POSTGRES_USER"], env["SQL_USER"], "the tool sets up the schema the server logs in to")
	require.Equal(t, server["POSTGRES_PWD"], env["SQL_PASSWORD"])

	script := c.script(t, "temporal-schema")
	for _, tt := range []struct{ db, dir string }{
		{server["DBNAME"], "temporal"},
		{server["VISIBILITY_DBNAME"], "visibility"},
	} {
		t.Run(tt.dir, func(t *testing.T) {
			require.Regexp(t, `--db "?`+regexp.QuoteMeta(tt.db)+`"? setup-schema -v 0\.0`, script)
			require.Regexp(t, `--db "?`+regexp.QuoteMeta(tt.db)+`"? update-schema -d /etc/temporal/schema/postgresql/v12/`+tt.dir+`/versioned`, script)
		})
	}
}

// The namespace and kasa's search attributes, which the server does not create by itself.
func TestComposeTemporalSetup(t *testing.T) {
	c := loadCompose(t)
	repo, tag := c.image(t, "temporal-setup")
	require.Equal(t, "temporalio/admin-tools", repo)
	_, schemaTag := c.image(t, "temporal-schema")
	require.Equal(t, schemaTag, tag)

	env := c.resolvedEnv(t, "temporal-setup")
	require.Equal(t, "temporal:7233", env["TEMPORAL_ADDRESS"], "the CLI reads the frontend's address from TEMPORAL_ADDRESS")
	ns := c.resolvedEnv(t, "api-1")["KASA_TEMPORAL_NAMESPACE"]
	require.Equal(t, ns, env["TEMPORAL_NAMESPACE"], "the namespace kasa uses")

	script := c.script(t, "temporal-setup")
	require.Contains(t, script, "operator namespace create")
	require.Contains(t, script, "operator search-attribute create")
	list := regexp.MustCompile(`(?m)^for sa in (.*); do$`).FindStringSubmatch(script)
	require.NotNil(t, list, "the script registers the attributes in a `for sa in NAME:TYPE...` loop")
	want := slices.Clone(devenv.SearchAttributes)
	got := strings.Fields(strings.ReplaceAll(list[1], ":", "="))
	sort.Strings(want)
	sort.Strings(got)
	require.Equal(t, want, got, "the search attributes kasa's workflows set, with their types")
}

func TestComposeTemporalUI(t *testing.T) {
	c := loadCompose(t)
	repo, _ := c.image(t, "temporal-ui")
	require.Equal(t, "temporalio/ui", repo)
	env := c.resolvedEnv(t, "temporal-ui")
	h, p := hostPort(t, env["TEMPORAL_ADDRESS"])
	require.Equal(t, "temporal", h, "the UI talks to the temporal service")
	_, ok := c.publishes(t, "temporal", p)
	require.Truef(t, ok, "port %s is not the server's frontend", p)
	require.Equal(t, c.resolvedEnv(t, "api-1")["KASA_TEMPORAL_NAMESPACE"], env["TEMPORAL_DEFAULT_NAMESPACE"])

	// The UI can signal, cancel and start workflows: only the password-asking proxy reaches it.
	require.Empty(t, c.ports(t, "temporal-ui"), "the UI itself is not published")
	script := c.script(t, "temporal-ui-proxy")
	require.Contains(t, script, "basic_auth")
	require.Contains(t, script, "reverse_proxy temporal-ui:"+env["TEMPORAL_UI_PORT"], "the proxy forwards to where the UI listens")
	pub, ok := c.publishes(t, "temporal-ui-proxy", "8233")
	require.True(t, ok)
	require.Contains(t, script, ":"+pub.target+" {", "the proxy listens on its published port")
	_, err := interpolate(c.env(t, "temporal-ui-proxy")["KASA_UI_PASSWORD"], map[string]string{})
	require.Error(t, err, "the UI's password is required, with no default")

	// Terminate and reset would leave a payment's hold or run its steps again; a cancellation
	// request ends a payment's workflow as a terminate does (the workflows do not handle one).
	for _, off := range []string{"TEMPORAL_WORKFLOW_TERMINATE_DISABLED", "TEMPORAL_WORKFLOW_RESET_DISABLED",
		"TEMPORAL_WORKFLOW_CANCEL_DISABLED", "TEMPORAL_BATCH_ACTIONS_DISABLED"} {
		require.Equal(t, "true", env[off], off)
	}
	requireTemporalClient(t, c, "temporal-ui", env["TEMPORAL_TLS_CERT"], env["TEMPORAL_TLS_KEY"], env["TEMPORAL_TLS_CA"], env["TEMPORAL_TLS_SERVER_NAME"])
	require.Equal(t, "true", env["TEMPORAL_TLS_ENABLE_HOST_VERIFICATION"])
}

// The Temporal Server asks every client for a certificate of the compose CA: kasa's processes,
// the namespace set-up and the server's own healthcheck present one; temporal-certs makes them
// once, before the server starts.
func TestComposeTemporalMutualTLS(t *testing.T) {
	c := loadCompose(t)
	server := c.resolvedEnv(t, "temporal")
	require.Equal(t, "service_completed_successfully", c.dependsOn(t, "temporal")["temporal-certs"])
	script := c.script(t, "temporal-certs")
	for _, name := range []string{"temporal", "client"} {
		require.Regexpf(t, `(?m)^issue `+name+` `, script, "the script issues %s.pem", name)
	}
	require.Contains(t, script, "DNS:"+server["TEMPORAL_TLS_FRONTEND_SERVER_NAME"], "the server's certificate names it as clients ask for it")
	for _, key := range []string{"TEMPORAL_TLS_SERVER_CERT", "TEMPORAL_TLS_FRONTEND_CERT"} {
		require.Equal(t, "/certs/temporal.pem", server[key], key)
	}
	for _, key := range []string{"TEMPORAL_TLS_SERVER_CA_CERT", "TEMPORAL_TLS_CLIENT1_CA_CERT", "TEMPORAL_TLS_CLIENT2_CA_CERT"} {
		require.Equal(t, "/certs/ca.pem", server[key], key)
	}
	var mounted bool
	for _, m := range c.mounts(t, "temporal") {
		mounted = mounted || (m.source == "temporal-server-certs" && m.target == "/certs" && m.readOnly)
	}
	require.True(t, mounted, "the server reads its certificate and key, read-only")
	for name := range c.services {
		for _, m := range c.mounts(t, name) {
			if m.source == "temporal-server-certs" {
				require.Containsf(t, []string{"temporal", "temporal-certs"}, name, "%s must not see the server's key", name)
			}
		}
	}

	for _, s := range append(slices.Clone(appServices), "migrate") {
		env := c.resolvedEnv(t, s)
		if env["KASA_TEMPORAL_ADDRESS"] == "" {
			continue
		}
		requireTemporalClient(t, c, s, env["KASA_TEMPORAL_TLS_CERT"], env["KASA_TEMPORAL_TLS_KEY"], env["KASA_TEMPORAL_TLS_CA"], env["KASA_TEMPORAL_TLS_SERVER_NAME"])
	}
	setup := c.resolvedEnv(t, "temporal-setup")
	requireTemporalClient(t, c, "temporal-setup", setup["TEMPORAL_TLS_CERT"], setup["TEMPORAL_TLS_KEY"], setup["TEMPORAL_TLS_CA"], setup["TEMPORAL_TLS_SERVER_NAME"])
	for _, flag := range []string{"--tls-cert-path", "--tls-key-path", "--tls-ca-path", "--tls-server-name"} {
		require.Contains(t, c.script(t, "temporal-setup"), flag, "the setup script's CLI calls present the certificate")
	}
	hc, _ := c.service(t, "temporal")["healthcheck"].(map[string]any)
	require.Contains(t, fmt.Sprint(hc["test"]), "--tls-cert-path /certs/temporal.pem", "the healthcheck presents the server's certificate")
}

// No password is written in the compose file: each is a variable the operator must set
// (deploy/compose-env.sh makes them), in the environment and in every database URL.
func TestComposeHasNoFixedPasswords(t *testing.T) {
	c := loadCompose(t)
	required := regexp.MustCompile(`^\$\{[A-Z_]+:\?[^}]*\}$`)
	for name := range c.services {
		for key, v := range c.env(t, name) {
			if strings.Contains(key, "PASSWORD") || strings.Contains(key, "PWD") {
				require.Regexpf(t, required, v, "%s: %s must be a required ${VAR:?...}, not a value", name, key)
			}
			if u, err := url.Parse(v); err == nil && u.User != nil {
				if pw, ok := u.User.Password(); ok {
					require.Regexpf(t, required, pw, "%s: %s carries a fixed password", name, key)
				}
			}
		}
	}

	// deploy/compose-env.sh writes every required variable, URL-safe, and keeps what is there.
	envFile := filepath.Join(t.TempDir(), ".env")
	require.NoError(t, os.WriteFile(envFile, []byte("KASA_ADMIN_TOKEN=mine"), 0o644)) // no newline at its end
	run := func() map[string]string {
		out, err := exec.Command("sh", filepath.Join(repoRoot(t), "deploy", "compose-env.sh"), envFile).CombinedOutput()
		require.NoError(t, err, "%s", out)
		b, err := os.ReadFile(envFile)
		require.NoError(t, err)
		vars := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, line)
			require.NotContains(t, vars, k, "%s written twice", k)
			vars[k] = v
		}
		return vars
	}
	vars := run()
	require.Equal(t, "mine", vars["KASA_ADMIN_TOKEN"], "a value already there is kept")
	for _, m := range varRef.FindAllStringSubmatch(c.raw, -1) {
		if v := m[1]; strings.Contains(v, "PASSWORD") || v == "KASA_SECRET_KEY" {
			require.Regexpf(t, `^[0-9a-f]{16,}$`, vars[v], "%s: random hex, safe in a URL", v)
		}
	}
	require.Len(t, vars["KASA_SECRET_KEY"], 64)
	require.Equal(t, vars, run(), "a second run changes nothing")
	fi, err := os.Stat(envFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "only its owner reads the secrets")
	for name := range c.services {
		for key, v := range c.env(t, name) {
			_, err := interpolate(v, vars)
			require.NoErrorf(t, err, "%s: %s with the variables compose-env.sh writes", name, key)
		}
	}
}

// requireTemporalClient checks that service holds the client certificate of the server's mutual
// TLS, as the server's CA signed it, at the paths given.
func requireTemporalClient(t *testing.T, c compose, service, cert, key, ca, serverName string) {
	t.Helper()
	server := c.resolvedEnv(t, "temporal")
	require.Equal(t, "true", server["TEMPORAL_TLS_REQUIRE_CLIENT_AUTH"], "the server asks every client for a certificate")
	require.Equal(t, server["TEMPORAL_TLS_CLIENT1_CA_CERT"], ca, "%s: the CA the server trusts", service)
	require.Equal(t, server["TEMPORAL_TLS_FRONTEND_SERVER_NAME"], serverName, "%s: the name on the server's certificate", service)
	require.Equal(t, "/certs/client.pem", cert, service)
	require.Equal(t, "/certs/client-key.pem", key, service)
	var mounted bool
	for _, m := range c.mounts(t, service) {
		mounted = mounted || (m.source == "temporal-client-certs" && m.target == "/certs" && m.readOnly)
		require.NotEqualf(t, "temporal-server-certs", m.source, "%s must not see the server's key", service)
	}
	require.Truef(t, mounted, "%s mounts the temporal-client-certs volume at /certs, read-only", service)
}

// The migrate service runs as the tables' owner and grants the application role; every other
// kasa process logs in as that role (docs/operations.md, "Database roles").
func TestComposeDatabaseRoles(t *testing.T) {
	c := loadCompose(t)
	user := func(raw string) string {
		t.Helper()
		u, err := url.Parse(raw)
		require.NoError(t, err)
		require.NotEmpty(t, u.User.Username(), "%s has no user", raw)
		return u.User.Username()
	}
	mig := c.resolvedEnv(t, "migrate")
	owner := user(mig["KASA_DATABASE_MIGRATE_URL"])
	app := user(mig["KASA_DATABASE_URL"])
	pg := c.env(t, "postgres")
	require.NotEqual(t, owner, app)
	require.NotEqual(t, pg["POSTGRES_USER"], owner, "the owner is not the superuser")
	require.NotEqual(t, pg["POSTGRES_USER"], app, "the application role is not the superuser")
	require.Equal(t, app, mig["KASA_DATABASE_APP_ROLE"], "migrate grants the role the others log in as")

	for _, s := range appServices {
		t.Run(s, func(t *testing.T) {
			env := c.resolvedEnv(t, s)
			require.Equal(t, app, user(env["KASA_DATABASE_URL"]))
			require.NotContains(t, env, "KASA_DATABASE_MIGRATE_URL", "only migrate holds the owner's password")
		})
	}

	t.Run("init script", func(t *testing.T) {
		var m mount
		for _, mm := range c.mounts(t, "postgres") {
			if strings.HasPrefix(mm.target, "/docker-entrypoint-initdb.d/") {
				m = mm
			}
		}
		require.True(t, m.bind(), "postgres runs an init script from the repository")
		require.True(t, strings.HasSuffix(m.target, ".sh"), "a script, which reads the passwords from the environment")
		// The statements only: comments may name what the script must not do.
		sql := regexp.MustCompile(`--[^\n]*|(?m)^#[^\n]*`).ReplaceAllString(readRepoFile(t, m.source), "")
		temporal := c.resolvedEnv(t, "temporal")
		// The script creates what is missing (tests TestComposePostgresInit runs it twice on a
		// real cluster and checks owners and passwords); here, that it names compose's roles.
		for _, role := range []string{owner, app, temporal["POSTGRES_USER"]} {
			require.Regexpf(t, `(?i)ALTER ROLE "?`+regexp.QuoteMeta(role)+`"? LOGIN PASSWORD :'`, sql, "role %s, its password from a variable", role)
		}
		require.Regexp(t, `(?i)ALTER DATABASE "?`+regexp.QuoteMeta(pg["POSTGRES_DB"])+`"? OWNER TO "?`+regexp.QuoteMeta(owner)+`"?`, sql,
			"kasa's database belongs to the owner role")
		require.Regexp(t, `(?i)CREATE DATABASE %I OWNER "?`+regexp.QuoteMeta(temporal["POSTGRES_USER"])+`"?`, sql, "Temporal's databases belong to its role")
		for _, db := range []string{temporal["DBNAME"], temporal["VISIBILITY_DBNAME"]} {
			require.Containsf(t, sql, "'"+db+"'", "Temporal's database %s", db)
		}
		require.NotRegexp(t, `(?i)GRANT\s+"?`+regexp.QuoteMeta(owner)+`"?\s+TO\s+"?`+regexp.QuoteMeta(app), sql,
			"the application role must not be a member of the owner")
		require.NotRegexp(t, `(?i)SUPERUSER`, sql)
		require.NotRegexp(t, `(?i)PASSWORD\s+'`, sql, "no password is written in the repository")
		for _, v := range []string{"KASA_DB_OWNER_PASSWORD", "KASA_DB_APP_PASSWORD", "KASA_TEMPORAL_DB_PASSWORD"} {
			require.Containsf(t, pg, v, "postgres hands %s to the init script", v)
		}
	})
}

// docker compose itself reads the file, where the docker CLI is installed (CI with Docker);
// everywhere else the tests above are the check.
func TestComposeConfig(t *testing.T) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		t.Log("docker compose config not run: no docker CLI on PATH")
		return
	}
	if out, err := exec.Command(docker, "compose", "version").CombinedOutput(); err != nil {
		t.Logf("docker compose config not run: docker compose version: %v: %s", err, out)
		return
	}
	cmd := exec.Command(docker, "compose", "--file", "docker-compose.yml", "config", "--quiet")
	cmd.Dir = repoRoot(t)
	cmd.Env = os.Environ()
	for k, v := range testVars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "docker compose config: %s", out)
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
	require.Regexp(t, `go build -tags production .*-o /out/kasa \./cmd/kasa`, instrs[builds], "the image carries the production build only")
	tools := slices.IndexFunc(instrs, func(in string) bool { return strings.HasSuffix(in, " AS tools") })
	require.GreaterOrEqual(t, tools, 0, "a tools stage carries the full binary (the bank simulator)")
	require.Contains(t, instrs[tools:lastStage], `COPY --from=build /out/kasa-tools /kasa`)
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

func TestComposePublishesOnLoopbackByDefault(t *testing.T) {
	c := loadCompose(t)
	for name := range c.services {
		for _, p := range c.ports(t, name) {
			t.Run(name+"/"+p.target, func(t *testing.T) {
				require.NotEmptyf(t, p.published, "%s: publish container port %s on an explicit host port", name, p.target)
				require.Equalf(t, "127.0.0.1", p.hostIP,
					"%s publishes %s on %q without KASA_PUBLISH_IP: use ${KASA_PUBLISH_IP:-127.0.0.1}", name, p.published, p.hostIP)
			})
		}
		list, _ := c.service(t, name)["ports"].([]any)
		for _, raw := range list {
			if s, ok := raw.(string); ok {
				require.Truef(t, strings.HasPrefix(s, "${KASA_PUBLISH_IP:-127.0.0.1}:"),
					"%s: port %q must honour KASA_PUBLISH_IP", name, s)
			}
		}
	}
}

type mount struct {
	source, target string
	readOnly       bool
}

// bind reports whether the mount is a host path rather than a named volume.
func (m mount) bind() bool {
	return strings.HasPrefix(m.source, ".") || strings.HasPrefix(m.source, "/") || strings.HasPrefix(m.source, "~")
}

// mounts returns the service's volumes, short ("src:dst[:mode]") or long syntax.
func (c compose) mounts(t *testing.T, name string) []mount {
	t.Helper()
	list, _ := c.service(t, name)["volumes"].([]any)
	var out []mount
	for _, v := range list {
		switch v := v.(type) {
		case string:
			parts := strings.Split(v, ":")
			require.GreaterOrEqualf(t, len(parts), 2, "%s: volume %q has no target", name, v)
			m := mount{source: parts[0], target: parts[1]}
			if len(parts) > 2 {
				m.readOnly = slices.Contains(strings.Split(parts[2], ","), "ro")
			}
			out = append(out, m)
		case map[string]any:
			ro, _ := v["read_only"].(bool)
			out = append(out, mount{source: fmt.Sprint(v["source"]), target: fmt.Sprint(v["target"]), readOnly: ro})
		default:
			t.Fatalf("service %s: volume entry has unexpected type %T", name, v)
		}
	}
	return out
}

// mountOf returns the service's mount of the repository path source ("./deploy/x.yml").
func (c compose) mountOf(t *testing.T, name, source string) mount {
	t.Helper()
	for _, m := range c.mounts(t, name) {
		if filepath.Clean(m.source) == filepath.Clean(source) {
			return m
		}
	}
	t.Fatalf("service %s does not mount %s", name, source)
	return mount{}
}

func TestComposeBindMountsExist(t *testing.T) {
	c := loadCompose(t)
	root := repoRoot(t)
	n := 0
	for name := range c.services {
		for _, m := range c.mounts(t, name) {
			if !m.bind() {
				continue
			}
			n++
			t.Run(name+"/"+m.target, func(t *testing.T) {
				require.Truef(t, strings.HasPrefix(m.source, "./"), "%s mounts %s: mount files from the repository (./...) only", name, m.source)
				_, err := os.Stat(filepath.Join(root, m.source))
				require.NoErrorf(t, err, "%s mounts %s, which is not in the repository", name, m.source)
				require.Truef(t, m.readOnly, "%s mounts %s writable: repository files are mounted :ro", name, m.source)
			})
		}
	}
	require.NotZero(t, n, "prometheus and grafana mount their configuration from the repository")
}

// flagValue returns the value of --name=value (or --name value) in args.
func flagValue(t *testing.T, args []string, name string) string {
	t.Helper()
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("flag --%s not found in %v", name, args)
	return ""
}

type prometheusConfig struct {
	Global struct {
		ScrapeInterval     string `yaml:"scrape_interval"`
		EvaluationInterval string `yaml:"evaluation_interval"`
	} `yaml:"global"`
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName        string `yaml:"job_name"`
		ScrapeInterval string `yaml:"scrape_interval"`
		MetricsPath    string `yaml:"metrics_path"`
		Scheme         string `yaml:"scheme"`
		StaticConfigs  []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func TestPrometheus(t *testing.T) {
	c := loadCompose(t)
	var cfg prometheusConfig
	dec := yaml.NewDecoder(strings.NewReader(readRepoFile(t, "deploy/prometheus.yml")))
	dec.KnownFields(true) // a misspelt key is an error here, as it is for Prometheus
	require.NoError(t, dec.Decode(&cfg), "deploy/prometheus.yml")

	args := c.command(t, "prometheus")
	require.Equal(t, c.mountOf(t, "prometheus", "./deploy/prometheus.yml").target, flagValue(t, args, "config.file"),
		"prometheus must read the mounted deploy/prometheus.yml")
	require.Contains(t, c.mounts(t, "prometheus"), mount{source: "prometheus-data", target: flagValue(t, args, "storage.tsdb.path")},
		"the TSDB must live on the prometheus-data volume")

	// job -> host:port, checked against where each compose service listens.
	targets := map[string][]string{}
	for _, sc := range cfg.ScrapeConfigs {
		interval := sc.ScrapeInterval
		if interval == "" {
			interval = cfg.Global.ScrapeInterval
		}
		require.Equalf(t, "5s", interval, "job %s: scrape interval", sc.JobName)
		require.Containsf(t, []string{"", "/metrics"}, sc.MetricsPath, "job %s: metrics path", sc.JobName)
		require.Containsf(t, []string{"", "http"}, sc.Scheme, "job %s: scheme", sc.JobName)
		for _, st := range sc.StaticConfigs {
			targets[sc.JobName] = append(targets[sc.JobName], st.Targets...)
		}
	}
	// Every instance of every process with metrics, at the address it listens on.
	for _, tt := range []struct {
		job      string
		services []string
		key      string
	}{
		{"api", instances("api"), "KASA_METRICS_ADDR"},
		{"worker", instances("worker"), "KASA_WORKER_METRICS_ADDR"},
		{"relay", instances("relay"), "KASA_RELAY_METRICS_ADDR"},
		{"temporal", []string{"temporal"}, "PROMETHEUS_ENDPOINT"},
	} {
		t.Run(tt.job, func(t *testing.T) {
			require.NotEmpty(t, tt.services)
			var want []string
			for _, s := range tt.services {
				host, listenPort := hostPort(t, c.resolvedEnv(t, s)[tt.key])
				require.Containsf(t, []string{"", "0.0.0.0", "::"}, host, "%s: %s must listen on all interfaces for Prometheus to reach it", s, tt.key)
				want = append(want, s+":"+listenPort)
			}
			got := slices.Clone(targets[tt.job])
			sort.Strings(got)
			require.Equalf(t, want, got, "job %s must scrape each of %v where %s listens", tt.job, tt.services, tt.key)
		})
	}
	for _, ts := range targets {
		for _, target := range ts {
			h, _ := hostPort(t, target)
			c.service(t, h) // every target is a compose service
		}
	}
}

// grafanaDatasourceUID is the uid of the provisioned Prometheus datasource; every dashboard panel uses it.
const grafanaDatasourceUID = "prometheus"

type grafanaDatasources struct {
	APIVersion  int `yaml:"apiVersion"`
	Datasources []struct {
		Name      string `yaml:"name"`
		Type      string `yaml:"type"`
		UID       string `yaml:"uid"`
		Access    string `yaml:"access"`
		URL       string `yaml:"url"`
		IsDefault bool   `yaml:"isDefault"`
	} `yaml:"datasources"`
}

type grafanaDashboardProviders struct {
	APIVersion int `yaml:"apiVersion"`
	Providers  []struct {
		Name    string `yaml:"name"`
		Type    string `yaml:"type"`
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

func TestGrafana(t *testing.T) {
	c := loadCompose(t)
	const provisioning = "/etc/grafana/provisioning/"
	dsMount := c.mountOf(t, "grafana", "./deploy/grafana/provisioning/datasources")
	require.Equal(t, provisioning+"datasources", dsMount.target)
	dbMount := c.mountOf(t, "grafana", "./deploy/grafana/provisioning/dashboards")
	require.Equal(t, provisioning+"dashboards", dbMount.target)

	t.Run("datasource", func(t *testing.T) {
		var ds grafanaDatasources
		require.NoError(t, yaml.Unmarshal([]byte(readRepoFile(t, "deploy/grafana/provisioning/datasources/prometheus.yml")), &ds))
		require.Equal(t, 1, ds.APIVersion)
		require.Len(t, ds.Datasources, 1)
		d := ds.Datasources[0]
		require.Equal(t, "prometheus", d.Type)
		require.Equal(t, grafanaDatasourceUID, d.UID, "the dashboard refers to the datasource by this uid")
		require.Equal(t, "proxy", d.Access, "the browser cannot resolve the prometheus service name: Grafana's server must query it")
		require.True(t, d.IsDefault)
		u, err := url.Parse(d.URL)
		require.NoError(t, err)
		require.Equal(t, "http", u.Scheme)
		require.Equal(t, "prometheus", u.Hostname(), "datasource url host is the prometheus service")
		_, ok := c.publishes(t, "prometheus", u.Port())
		require.Truef(t, ok, "datasource port %s is not the port prometheus listens on", u.Port())
	})

	t.Run("dashboards", func(t *testing.T) {
		var dp grafanaDashboardProviders
		require.NoError(t, yaml.Unmarshal([]byte(readRepoFile(t, "deploy/grafana/provisioning/dashboards/kasa.yml")), &dp))
		require.Equal(t, 1, dp.APIVersion)
		require.Len(t, dp.Providers, 1)
		p := dp.Providers[0]
		require.Equal(t, "file", p.Type)
		docs := c.mountOf(t, "grafana", "./docs/grafana")
		require.Equal(t, docs.target, p.Options.Path, "the provider must read the folder docs/grafana is mounted on")
		home := c.env(t, "grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
		rel, ok := strings.CutPrefix(home, docs.target+"/")
		require.Truef(t, ok, "home dashboard %q is not in the mounted docs/grafana (%s)", home, docs.target)
		_, err := os.Stat(filepath.Join(repoRoot(t), "docs/grafana", rel))
		require.NoError(t, err, "home dashboard")
	})

	t.Run("anonymous viewers", func(t *testing.T) {
		env := c.env(t, "grafana")
		require.Equal(t, "true", env["GF_AUTH_ANONYMOUS_ENABLED"])
		require.Equal(t, "Viewer", env["GF_AUTH_ANONYMOUS_ORG_ROLE"], "anonymous users must not edit")
	})

	t.Run("starts after prometheus", func(t *testing.T) {
		_, ok := c.dependsOn(t, "grafana")["prometheus"]
		require.True(t, ok)
	})
}

// metricKind is how a dashboard may use a metric: histograms through their _bucket/_count/_sum series.
type metricKind int

const (
	counter metricKind = iota
	gauge
	histogram
)

// dashboardMetrics is every metric docs/grafana/kasa-dashboard.json queries. Each must be
// registered by kasa's code (TestDashboard greps api/ and outbox/ for its name).
var dashboardMetrics = map[string]metricKind{
	"kasa_http_request_duration_seconds":        histogram,
	"kasa_payment_sync_duration_seconds":        histogram,
	"kasa_workflow_start_duration_seconds":      histogram,
	"kasa_idempotency_requests_total":           counter,
	"kasa_unique_conflicts_total":               counter,
	"kasa_db_lock_waiting":                      gauge,
	"kasa_hot_account_postings_per_minute":      gauge,
	"kasa_hot_account_share":                    gauge,
	"kasa_db_table_bytes":                       gauge,
	"kasa_db_index_bytes":                       gauge,
	"kasa_unknown_payments":                     gauge,
	"kasa_payments_stuck":                       gauge,
	"kasa_unknown_refunds":                      gauge,
	"kasa_refunds_stuck":                        gauge,
	"kasa_authorizations_open":                  gauge,
	"kasa_authorizations_overdue":               gauge,
	"kasa_reconcile_age_seconds":                gauge,
	"kasa_reconcile_last_mismatches":            gauge,
	"kasa_reconcile_last_run_timestamp_seconds": gauge,
	"kasa_reconcile_outcomes_total":             counter,
	"kasa_outbox_backlog":                       gauge,
	"kasa_outbox_oldest_age_seconds":            gauge,
	"kasa_relay_backlog":                        gauge,
	"kasa_outbox_publish_latency_seconds":       histogram,
	"kasa_webhook_deliveries_total":             counter,
	"kasa_webhook_attempts_per_delivery":        histogram,
	"kasa_outbox_republished_total":             counter,
	"kasa_webhook_events_consumed_total":        counter,
	"kasa_outbox_redelivery_given_up_total":     counter,
	"kasa_backlog_queued":                       gauge,
	"kasa_backlog_oldest_age_seconds":           gauge,
	"kasa_backlog_drain_per_second":             gauge,
	"kasa_backlog_refused_total":                counter,
}

// dashboardRows are the dashboard's rows, in order: the questions of the metrics table in docs/operations.md.
var dashboardRows = []string{"Throughput and latency", "Duplicates and conflicts", "Database", "Money at risk", "Events", "Start backlog"}

type grafanaDatasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaPanel struct {
	ID          int                      `json:"id"`
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description"`
	Datasource  *grafanaDatasourceRef    `json:"datasource"`
	GridPos     struct{ H, W, X, Y int } `json:"gridPos"`
	Targets     []struct {
		Datasource *grafanaDatasourceRef `json:"datasource"`
		Expr       string                `json:"expr"`
		RefID      string                `json:"refId"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's panels
}

var (
	metricRef     = regexp.MustCompile(`kasa_[a-z_]+`)
	metricLiteral = regexp.MustCompile(`"(kasa_[a-z_]+)"`)
	byClause      = regexp.MustCompile(`by \(([^)]*)\)`)
)

// registeredMetrics returns the "kasa_..." string literals in the non-test Go files under dirs.
func registeredMetrics(t *testing.T, dirs ...string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(repoRoot(t), dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range metricLiteral.FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
			return nil
		})
		require.NoError(t, err)
	}
	require.NotEmpty(t, out, "no metric names found in %v", dirs)
	return out
}

func TestDashboard(t *testing.T) {
	var dash struct {
		UID           string         `json:"uid"`
		Title         string         `json:"title"`
		SchemaVersion int            `json:"schemaVersion"`
		Panels        []grafanaPanel `json:"panels"`
	}
	require.NoError(t, json.Unmarshal([]byte(readRepoFile(t, "docs/grafana/kasa-dashboard.json")), &dash))
	require.NotEmpty(t, dash.UID, "a stable uid keeps the dashboard's URL across provisioning")
	require.NotEmpty(t, dash.Title)
	require.GreaterOrEqual(t, dash.SchemaVersion, 36, "schema version")

	var all []grafanaPanel
	var rows []string
	for _, p := range dash.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
		if p.Type == "row" {
			rows = append(rows, p.Title)
		}
	}
	require.Equal(t, dashboardRows, rows)

	ids := map[int]string{}
	used := map[string]bool{}
	for _, p := range all {
		require.NotZerof(t, p.ID, "panel %q has no id", p.Title)
		prev, dup := ids[p.ID]
		require.Falsef(t, dup, "panels %q and %q share id %d", prev, p.Title, p.ID)
		ids[p.ID] = p.Title
		require.LessOrEqualf(t, p.GridPos.X+p.GridPos.W, 24, "panel %q is wider than the grid", p.Title)
		if p.Type == "row" {
			continue
		}
		t.Run(p.Title, func(t *testing.T) {
			require.NotEmpty(t, strings.TrimSpace(p.Description), "say which question the panel answers")
			require.NotNil(t, p.Datasource)
			require.Equal(t, grafanaDatasourceRef{Type: "prometheus", UID: grafanaDatasourceUID}, *p.Datasource)
			require.NotEmpty(t, p.Targets)
			for _, tg := range p.Targets {
				if tg.Datasource != nil {
					require.Equal(t, grafanaDatasourceUID, tg.Datasource.UID, "target %s datasource", tg.RefID)
				}
				require.NotEmpty(t, tg.Expr, "target %s", tg.RefID)
				names := metricRef.FindAllString(tg.Expr, -1)
				require.NotEmptyf(t, names, "target %s queries no kasa metric: %s", tg.RefID, tg.Expr)
				for _, name := range names {
					base, kind := name, metricKind(-1)
					if k, ok := dashboardMetrics[name]; ok {
						kind = k
					} else {
						for _, suffix := range []string{"_bucket", "_count", "_sum"} {
							b, ok := strings.CutSuffix(name, suffix)
							if k, known := dashboardMetrics[b]; ok && known && k == histogram {
								base, kind = b, histogram
							}
						}
					}
					require.NotEqualf(t, metricKind(-1), kind, "%s (in %s) is not in dashboardMetrics", name, tg.Expr)
					require.Falsef(t, kind == histogram && base == name,
						"%s is a histogram: query its _bucket, _count or _sum series", name)
					if strings.HasSuffix(name, "_bucket") && kind == histogram {
						require.Contains(t, tg.Expr, "histogram_quantile(", "a _bucket series is only meaningful in histogram_quantile")
						for _, by := range byClause.FindAllStringSubmatch(tg.Expr, -1) {
							require.Containsf(t, strings.Split(strings.ReplaceAll(by[1], " ", ""), ","), "le",
								"aggregating %s without le breaks histogram_quantile: %s", name, tg.Expr)
						}
					}
					used[base] = true
				}
			}
		})
	}

	for name := range dashboardMetrics {
		require.Truef(t, used[name], "%s is in dashboardMetrics but no panel queries it", name)
	}

	registered := registeredMetrics(t, "api", "outbox")
	for name := range dashboardMetrics {
		t.Run("registered/"+name, func(t *testing.T) {
			require.Truef(t, registered[name], "the dashboard queries %s, which no code under api/ or outbox/ registers", name)
		})
	}
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#+ (.+)$`)
)

// slug is GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The deployment guide is reachable from the README, and every file and section it points to exists.
func TestDeploymentDoc(t *testing.T) {
	require.Contains(t, readRepoFile(t, "README.md"), "](docs/deployment.md)", "README links the deployment guide")
	doc := readRepoFile(t, "docs/deployment.md")
	links := mdLink.FindAllStringSubmatch(doc, -1)
	require.NotEmpty(t, links)
	for _, l := range links {
		target := l[1]
		if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") {
			continue
		}
		t.Run(target, func(t *testing.T) {
			file, anchor, _ := strings.Cut(target, "#")
			rel := filepath.Join("docs", file)
			if file == "" {
				rel = "docs/deployment.md"
			}
			body := readRepoFile(t, rel)
			if anchor == "" {
				return
			}
			var slugs []string
			for _, h := range mdHeading.FindAllStringSubmatch(body, -1) {
				slugs = append(slugs, slug(h[1]))
			}
			require.Containsf(t, slugs, anchor, "%s has no heading for #%s", rel, anchor)
		})
	}
}

// temporalServices is how many services the one temporal container runs; each opens its own pools.
const temporalServices = 4 // frontend, history, matching, worker

// PostgreSQL must admit every pool at its fullest: kasa's processes and the Temporal Server's
// services all use the one server.
func TestComposePostgresConnections(t *testing.T) {
	c := loadCompose(t)
	cfg, err := config.Load()
	require.NoError(t, err)
	kasaMax := int(cfg.Database.MaxConns)
	if v := c.env(t, "api-1")["KASA_DATABASE_MAX_CONNS"]; v != "" {
		kasaMax, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	need := (len(appServices) + 1) * kasaMax // + migrate
	temporal := c.env(t, "temporal")
	pool := func(key string, def int) int {
		if v := temporal[key]; v != "" {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			return n
		}
		return def // the server image's defaults
	}
	need += temporalServices * (pool("SQL_MAX_CONNS", 20) + pool("SQL_VIS_MAX_CONNS", 10))
	need += 10 // psql, the healthcheck, the schema tools

	args := c.command(t, "postgres")
	require.NotEmpty(t, args, "postgres sets max_connections on its command line")
	var max int
	for i, a := range args {
		if a == "-c" && i+1 < len(args) {
			if v, ok := strings.CutPrefix(args[i+1], "max_connections="); ok {
				max, err = strconv.Atoi(v)
				require.NoError(t, err)
			}
		}
	}
	require.GreaterOrEqualf(t, max, need, "max_connections must cover every pool at its fullest (%d)", need)
}
