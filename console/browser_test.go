package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// chromium is the headless browser: FERRY_CHROMIUM, or chromium on PATH
// (Debian's package, installed by compose/local/chromium.sh, which make
// test runs). A missing browser fails the test: it never skips.
func chromium(t *testing.T) string {
	if p := os.Getenv("FERRY_CHROMIUM"); p != "" {
		return p
	}
	p, err := exec.LookPath("chromium")
	require.NoError(t, err, "no chromium: run compose/local/chromium.sh (or set FERRY_CHROMIUM)")
	return p
}

// artefacts is where the screenshots go: FERRY_ARTEFACTS_DIR, default
// console/testdata/artefacts (git-ignored).
func artefacts(t *testing.T) string {
	dir := os.Getenv("FERRY_ARTEFACTS_DIR")
	if dir == "" {
		dir = filepath.Join(testenv.RepoRoot(), "console", "testdata", "artefacts")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// newBrowser starts headless Chromium for the test and returns its
// context; a tab is chromedp.NewContext of it.
func newBrowser(t *testing.T) context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 1000), chromedp.Flag("disable-dev-shm-usage", true))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser, chromedp.Navigate("about:blank")), "start chromium")
	return browser
}

// TestConsoleInBrowser drives the console in headless Chromium on every
// broker: a failing handler puts a message with a hostile body into the
// DLQ; the test finds it by its app id, sees the body as text (no script
// ran, no element was made of it), replays it with the token, and sees it
// handled on its story page; the overview's backlog is what `ferry outbox
// stats` says. Screenshots of each page are saved (the path is logged).
func TestConsoleInBrowser(t *testing.T) {
	browser := newBrowser(t)
	dir := artefacts(t)
	t.Logf("screenshots in %s", dir)

	for _, name := range ferrycli.BrokerNames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bu := setup(t, name, console.Config{Token: testToken})
			appID := "app-" + name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			ids := bu.enqueue(t, outbox.Event{Type: "job.run", Key: "k1", AppID: appID, Body: []byte(hostile)})
			bu.waitDead(t, 1)
			bu.failing.Store(false)
			// A backlog that stays: a destination no relay serves.
			bu.enqueue(t, outbox.Event{Type: "job.run", Destination: "idle", Body: []byte(`{}`)},
				outbox.Event{Type: "job.run", Destination: "idle", Body: []byte(`{}`)})

			tab, cancel := chromedp.NewContext(browser)
			defer cancel()
			tab, cancelT := context.WithTimeout(tab, 3*time.Minute)
			defer cancelT()
			shot := func(page string) chromedp.Action[chromedp.Void] {
				return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
					buf, err := chromedp.FullScreenshot(100)(ctx, tg)
					if err != nil {
						return chromedp.Void{}, err
					}
					return chromedp.Void{}, os.WriteFile(filepath.Join(dir, name+"-"+page+".png"), buf, 0o644)
				}
			}
			text := func(sel string) string {
				v, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(sel)))
				require.NoError(t, err, "text of %s", sel)
				return v
			}

			// Find the message by its app id, open it.
			require.NoError(t, chromedp.Do(tab,
				chromedp.Navigate(bu.base+"/dlq?queue="+bu.queue),
				chromedp.WaitVisible(chromedp.CSS(`input[name=app_id]`)),
				shot("dlq"),
				chromedp.SendKeys(chromedp.CSS(`input[name=app_id]`), appID),
				chromedp.Submit(chromedp.CSS(`input[name=app_id]`)),
			))
			// The queue's page before the search can list a.msg too: wait
			// for the search's page, or the click can find a node the
			// navigation detaches ("Could not find node with given id",
			// CI red once).
			require.Eventually(t, func() bool {
				loc, err := chromedp.Run(tab, chromedp.Location())
				return err == nil && strings.Contains(loc, "app_id=")
			}, 20*time.Second, 50*time.Millisecond, "the search's page")
			require.NoError(t, chromedp.Do(tab,
				chromedp.WaitVisible(chromedp.CSS(`a.msg`)),
				chromedp.Click(chromedp.CSS(`a.msg`)),
				chromedp.WaitVisible(chromedp.CSS(`#body`)),
				shot("message"),
			))
			body := text(`#body`)
			title, err := chromedp.Run(tab, chromedp.Title())
			require.NoError(t, err)
			made, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('main script, main img').length`))
			require.NoError(t, err)
			require.Contains(t, body, `<script>document.title='pwned'</script>"><img src=x onerror=`, "the hostile body shows as text")
			require.Contains(t, body, "\uFFFD", "invalid UTF-8 shows as U+FFFD")
			require.NotContains(t, title, "pwned", "no script of the body ran")
			require.Zero(t, made, "no element was made of the body")

			// Replay it with the token.
			require.NoError(t, chromedp.Do(tab,
				chromedp.Click(chromedp.CSS(`#replay`)),
				chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
				shot("confirm"),
				chromedp.SendKeys(chromedp.CSS(`#operator`), "browser-test"),
				chromedp.SendKeys(chromedp.CSS(`#token`), testToken),
				chromedp.Click(chromedp.CSS(`#confirm`)),
				chromedp.WaitVisible(chromedp.CSS(`#done, #error`)),
			))
			require.Contains(t, text(`main`), "1 message(s) replayed")

			// Its story says handled once the worker handled it.
			state := ""
			for state != "handled" {
				require.NoError(t, tab.Err(), "the message was not handled after the replay (state %q)", state)
				require.NoError(t, chromedp.Do(tab,
					chromedp.Navigate(bu.base+"/story?q="+appID),
					chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#state-%d`, ids[0]))),
				))
				state = text(fmt.Sprintf(`#state-%d`, ids[0]))
				if state != "handled" {
					time.Sleep(300 * time.Millisecond)
				}
			}
			require.Equal(t, int64(1), bu.handled.Load())
			require.NoError(t, chromedp.Do(tab, shot("story")))

			// The overview's backlog is outbox stats'.
			require.NoError(t, chromedp.Do(tab,
				chromedp.Navigate(bu.base+"/"),
				chromedp.WaitVisible(chromedp.CSS(`#unprocessed`)),
				shot("overview"),
			))
			backlog := text(`#unprocessed`)
			require.NoError(t, chromedp.Do(tab,
				chromedp.Navigate(bu.base+"/outbox?state=pending"),
				chromedp.WaitVisible(chromedp.CSS(`table`)),
				shot("outbox"),
			))
			require.Equal(t, strconv.FormatInt(bu.outboxStatsCLI(t), 10), strings.TrimSpace(backlog))
			require.Equal(t, "2", strings.TrimSpace(backlog))
		})
	}
}
