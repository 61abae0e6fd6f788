#!/usr/bin/env python3
"""Checks that the documentation follows the program.

    check_docs.py options    FENCERUN SOURCE_DIR   every --long option of `fencerun --help` and of
                                                   every subcommand's own help is in the man page
                                                   and in all three completions, and so are the
                                                   subcommands
    check_docs.py golden     FENCERUN SOURCE_DIR   `fencerun --help` equals tests/docs/help.golden
    check_docs.py complete   FENCERUN SOURCE_DIR   the bash and fish completions really offer every
                                                   option and subcommand (exit 77: skipped)
    check_docs.py events     FENCERUN SOURCE_DIR   every log event the sources emit is listed in the
                                                   man page's LOG EVENTS section, and nothing else is
    check_docs.py commands   FENCERUN SOURCE_DIR   each list of commands in the bash, zsh and fish
                                                   completions (the subcommands, the commands `help`
                                                   takes, the fence guards, ...) is exactly the
                                                   table of commands `fencerun --help` lists

The commands are those of the parser's one table (src/cli/parse.cpp), as `fencerun --help` lists them
under "Subcommands": nothing here names them.

When the help text changes on purpose, regenerate the golden file from the build tree:

    build/src/fencerun --help > tests/docs/help.golden

and document any new option in man/fencerun.1.adoc, README.md and completions/*.
"""
import difflib
import os
import re
import shutil
import subprocess
import sys

SKIP = 77


def help_text(fencerun, command=()):
    """`fencerun --help`, or the help of one command (`fencerun CMD... --help`)."""
    r = subprocess.run([fencerun, *command, "--help"], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        sys.exit(f"`fencerun {' '.join(command)} --help` exited {r.returncode}: {r.stderr}")
    return r.stdout


def table_commands(fencerun):
    """The table of commands, as the "Subcommands" list of `fencerun --help` shows it: the words
    (run, status, ..., fence, help) and the fence guards (from `fence file|redis|sql`)."""
    text = help_text(fencerun)
    if "\nSubcommands" not in text:
        sys.exit("`fencerun --help` has no Subcommands list")
    section = text.split("\nSubcommands", 1)[1].split("\n", 1)[1].split("\n\n", 1)[0]
    words, guards = [], []
    for line in section.splitlines():
        m = re.match(r"^  ([a-z]+)(?: (\S+))?", line)
        if not m:
            continue
        words.append(m.group(1))
        if m.group(1) == "fence" and m.group(2):
            guards = m.group(2).split("|")
    if len(words) < 5 or "help" not in words or not guards:
        sys.exit(f"found only the commands {words} and guards {guards} in `fencerun --help`; is the parser right?")
    return words, guards


def help_commands(words, guards):
    """Every command with a help of its own (`fencerun help CMD`), as the words that select it."""
    return [[]] + [[w] for w in words if w != "help"] + [["fence", g] for g in guards]


def section_options(text):
    """The --long options of a help text's "Options:" section: what that command takes."""
    section = text.split("\nOptions:\n", 1)[-1].split("\n\n", 1)[0]
    return [m.group(1) for m in re.finditer(r"^ {2}(?:-\w, | {4})(--[a-z][a-z0-9-]*)", section, re.M)]


def long_options(text):
    """Every --long option named anywhere in the help text, in order of first appearance."""
    seen = []
    for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
        if m.group(0) not in seen:
            seen.append(m.group(0))
    return seen


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def word(opt):
    """`opt` as a whole word: not followed by more option characters."""
    return re.escape(opt) + r"(?![a-z0-9-])"


def check_options(fencerun, src):
    SUBCOMMANDS, FENCE_GUARDS = table_commands(fencerun)
    HELP_COMMANDS = help_commands(SUBCOMMANDS, FENCE_GUARDS)
    options = long_options(help_text(fencerun))
    # Every subcommand's and guard's own options too.
    for command in HELP_COMMANDS:
        own = help_text(fencerun, command)
        if command and own == help_text(fencerun):
            sys.exit(f"`fencerun {' '.join(command)} --help` prints the top-level help, not its own")
        for opt in section_options(own):
            if opt not in options:
                options.append(opt)
    if len(options) < 20:
        sys.exit(f"found only {len(options)} options in `fencerun --help`: {options}; is the parser right?")
    man = read(os.path.join(src, "man", "fencerun.1.adoc"))
    bash = read(os.path.join(src, "completions", "fencerun.bash"))
    zsh = read(os.path.join(src, "completions", "_fencerun"))
    fish = read(os.path.join(src, "completions", "fencerun.fish"))
    problems = []

    for opt in options:
        # The man page must describe it as a term of a definition list (`*--opt* ...::` or
        # `*-o*, *--opt* ...::`), not only mention it somewhere.
        if not re.search(r"^(\*-[A-Za-z]\*, )?\*" + word(opt) + r"\*[^\n]*::[ \t]*$", man, re.M):
            problems.append(f"man/fencerun.1.adoc: no entry `*{opt}*...::` for {opt}")
        if not re.search(r"(?<![\w-])" + word(opt), bash):
            problems.append(f"completions/fencerun.bash: {opt} missing")
        if not re.search(r"(?<![\w-])" + word(opt), zsh):
            problems.append(f"completions/_fencerun: {opt} missing")
        if not re.search(r"-l " + word(opt[2:]), fish):
            problems.append(f"completions/fencerun.fish: no `-l {opt[2:]}`")

    for sub in SUBCOMMANDS:
        if not re.search(r"compgen -W '[^']*(?<![\w-])" + sub + r"(?![\w-])", bash):
            problems.append(f"completions/fencerun.bash: subcommand {sub} is not offered (compgen -W)")
        if not re.search(r"'" + sub + r":", zsh):
            problems.append(f"completions/_fencerun: subcommand {sub} is not described ('{sub}:...')")
        if not re.search(r"-a '?" + sub + r"\b", fish):
            problems.append(f"completions/fencerun.fish: subcommand {sub} is not offered (-a {sub})")
        if not re.search(r"\*fencerun " + sub + r"\*|^\*" + sub + r"\*", man, re.M):
            problems.append(f"man/fencerun.1.adoc: subcommand {sub} is not described")
    for guard in FENCE_GUARDS:
        if not re.search(r"(?<![\w-])" + guard + r"(?![\w-])", bash.split("_fencerun_fence()", 1)[-1]):
            problems.append(f"completions/fencerun.bash: fence guard {guard} missing")
        if not re.search(r"'" + guard + r":", zsh):
            problems.append(f"completions/_fencerun: fence guard {guard} missing")
        if not re.search(r"-a " + guard + r"\b", fish):
            problems.append(f"completions/fencerun.fish: fence guard {guard} missing")

    # Files the README links to exist (the examples are renamed now and then).
    readme = read(os.path.join(src, "README.md"))
    for link in sorted(set(re.findall(r"\]\(((?:packaging|docs|man|completions)/[^)#\s]*)\)", readme))):
        if not os.path.exists(os.path.join(src, link)):
            problems.append(f"README.md: the link {link} leads nowhere")

    # Exit statuses the program documents must be in the man page's EXIT STATUS section.
    exit_section = man.split("== EXIT STATUS", 1)[-1].split("\n== ", 1)[0]
    for code in ["64", "69", "70", "75", "77", "124", "126", "127"]:
        if not re.search(r"^\*" + code + r"\*::", exit_section, re.M):
            problems.append(f"man/fencerun.1.adoc: EXIT STATUS has no entry for {code}")

    if problems:
        print("The documentation does not follow `fencerun --help`:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)
    print(f"{len(options)} options and {len(SUBCOMMANDS)} subcommands documented in the man page "
          f"and in the bash, zsh and fish completions")


def check_golden(fencerun, src):
    golden_path = os.path.join(src, "tests", "docs", "help.golden")
    actual = help_text(fencerun)
    golden = read(golden_path)
    if actual != golden:
        diff = difflib.unified_diff(golden.splitlines(True), actual.splitlines(True),
                                    "tests/docs/help.golden", "fencerun --help")
        sys.stderr.write("".join(diff))
        sys.exit("`fencerun --help` differs from tests/docs/help.golden. If the change is intended, run\n"
                 "  build/src/fencerun --help > tests/docs/help.golden\n"
                 "and bring man/fencerun.1.adoc, README.md and completions/* along.")
    print("fencerun --help matches tests/docs/help.golden")


# Completion, run for real. Each option must be offered in at least one of these contexts, and each
# command's own options (from its help) in its context.
CONTEXTS = [[], ["status"], ["list"], ["break"], ["bump"], ["acl"]]


def bash_complete(src, words):
    """Candidates bash offers for the last word of `words` (a list, `fencerun` first)."""
    script = r'''
source /usr/share/bash-completion/bash_completion
source "$1"; shift
COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
_fencerun fencerun "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}" 2>/dev/null
printf '%s\n' "${COMPREPLY[@]}"
'''
    r = subprocess.run(["bash", "-c", script, "bash", os.path.join(src, "completions", "fencerun.bash")] + words,
                       capture_output=True, text=True, timeout=20)
    return set(r.stdout.split())


def fish_complete(src, line):
    script = 'source $argv[1]; complete -C $argv[2]'
    r = subprocess.run(["fish", "--no-config", "-c", script, os.path.join(src, "completions", "fencerun.fish"), line],
                       capture_output=True, text=True, timeout=20)
    return {l.split("\t", 1)[0] for l in r.stdout.splitlines() if l}


def check_complete(fencerun, src):
    SUBCOMMANDS, FENCE_GUARDS = table_commands(fencerun)
    HELP_COMMANDS = help_commands(SUBCOMMANDS, FENCE_GUARDS)
    options = long_options(help_text(fencerun))
    problems, ran = [], []

    if os.path.exists("/usr/share/bash-completion/bash_completion") and shutil.which("bash"):
        ran.append("bash")
        offered = set()
        for ctx in CONTEXTS:
            offered |= bash_complete(src, ["fencerun"] + ctx + ["--"])
        problems += [f"bash: `fencerun [run|status|acl] --<TAB>` never offers {o}" for o in options if o not in offered]
        for command in HELP_COMMANDS:
            if command == ["fence"]:
                continue
            got = bash_complete(src, ["fencerun"] + command + ["--"])
            problems += [f"bash: `fencerun {' '.join(command)} --<TAB>` does not offer {o}"
                         for o in section_options(help_text(fencerun, command)) if o not in got]
        subs = bash_complete(src, ["fencerun", ""])
        problems += [f"bash: `fencerun <TAB>` does not offer {s}" for s in SUBCOMMANDS if s not in subs]
        guards = bash_complete(src, ["fencerun", "fence", ""])
        problems += [f"bash: `fencerun fence <TAB>` does not offer {g}" for g in FENCE_GUARDS if g not in guards]
    else:
        print("bash-completion is not installed: bash completion not exercised")

    if shutil.which("fish"):
        ran.append("fish")
        offered = set()
        for ctx in CONTEXTS:
            offered |= fish_complete(src, " ".join(["fencerun"] + ctx + ["--"]))
        problems += [f"fish: `fencerun [status|acl] --<TAB>` never offers {o}" for o in options if o not in offered]
        for command in HELP_COMMANDS:
            if command == ["fence"]:
                continue
            got = fish_complete(src, " ".join(["fencerun"] + command + ["--"]))
            problems += [f"fish: `fencerun {' '.join(command)} --<TAB>` does not offer {o}"
                         for o in section_options(help_text(fencerun, command)) if o not in got]
        subs = fish_complete(src, "fencerun ")
        problems += [f"fish: `fencerun <TAB>` does not offer {s}" for s in SUBCOMMANDS if s not in subs]
        guards = fish_complete(src, "fencerun fence ")
        problems += [f"fish: `fencerun fence <TAB>` does not offer {g}" for g in FENCE_GUARDS if g not in guards]
    else:
        print("fish is not installed: fish completion not exercised")

    if shutil.which("zsh"):
        ran.append("zsh (syntax)")
        r = subprocess.run(["zsh", "-n", os.path.join(src, "completions", "_fencerun")], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append("zsh: completions/_fencerun does not parse: " + r.stderr.strip())

    if problems:
        print("Shell completion does not follow `fencerun --help`:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)
    if not ran:
        print("SKIPPED: neither bash-completion, fish nor zsh is installed")
        sys.exit(SKIP)
    print("completion checked with " + ", ".join(ran))


# ---- The lists of commands in the completions against the table.

def words_of(match):
    """The words of a matched list ('run status list'), or None when the list was not found."""
    return match.group(1).split() if match else None


def block(text, start, end):
    """The text from `start` (a regular expression) to the next `end` after it; "" when absent."""
    m = re.search(start, text, re.M)
    if not m:
        return ""
    rest = text[m.end():]
    return rest[:rest.find(end)] if end in rest else rest


def completion_lists(shell, text):
    """Each list of commands the completion file of `shell` holds: {what: [words] or None}."""
    if shell == "bash":
        return {
            "the subcommands (`fencerun <TAB>`)":
                words_of(re.search(r"if \[\[ -z \$subcommand \]\]; then\s+COMPREPLY=\(\$\(compgen -W '([^']*)'", text)),
            "the commands after `help`":
                words_of(re.search(r"\$subcommand == help\b[^\n]*\n\s+COMPREPLY=\(\$\(compgen -W '([^']*)'", text)),
            "the fence guards":
                [w for w in words_of(re.search(r"if \[\[ -z \$guard \]\]; then\s+COMPREPLY=\(\$\(compgen -W '([^']*)'",
                                               text)) or [] if not w.startswith("-")] or None,
            "the subcommands with options (case $subcommand)":
                re.findall(r"^\s+([a-z]+)\) COMPREPLY", block(text, r"if \[\[ \$cur == -\* \]\]; then\n\s+case \$subcommand in",
                                                           "esac"), re.M) or None,
        }
    if shell == "zsh":
        return {
            "the subcommands (subcommands=(...))":
                re.findall(r"'([a-z]+):", block(text, r"subcommands=\(", ")\n")) or None,
            "the commands after `help` (compadd)":
                words_of(re.search(r"^\s+\(help\)\n[^\n]*compadd ([a-z ]+)$", text, re.M)),
            "the fence guards (guards=(...))":
                re.findall(r"'([a-z]+):", block(text, r"guards=\(", ")\n")) or None,
            "the subcommands with a case (case $sub)":
                re.findall(r"^\s+\(([a-z]+)\)$", block(text, r"^  case \$sub in$", "\n  esac"), re.M) or None,
        }
    return {
        "the subcommands (-n $needs_sub -a)": re.findall(r"-n \$needs_sub -a (\w+)", text) or None,
        "the commands after `help`":
            words_of(re.search(r"-n __fencerun_help_needs_command -a '([^']*)'", text)),
        "the fence guards": re.findall(r"-n __fencerun_fence_needs_guard -a (\w+)", text) or None,
        "the subcommands that are no run (__fencerun_run_form)":
            words_of(re.search(r'function __fencerun_run_form\n.*?not contains -- "\$w" ([a-z ]+)\n', text, re.S)),
    }


def expected_lists(shell, words, guards):
    """What each list of completion_lists() must hold, from the table."""
    helped = [w for w in words if w != "help"]
    if shell == "bash":
        return [words, helped, guards, [w for w in words if w not in ("fence", "help")]]
    if shell == "zsh":
        return [words, helped, guards, [w for w in words if w != "fence"]]
    return [words, helped, guards, [w for w in words if w != "run"]]


def command_problems(shell, path, text, words, guards):
    problems = []
    for (what, got), want in zip(completion_lists(shell, text).items(), expected_lists(shell, words, guards)):
        if got is None:
            problems.append(f"{path}: {what}: the list was not found")
            continue
        missing = [w for w in want if w not in got]
        extra = [w for w in got if w not in want]
        if missing or extra or len(got) != len(set(got)):
            problems.append(f"{path}: {what} are {' '.join(got)}; the table has {' '.join(want)}"
                            + (f" (missing: {' '.join(missing)})" if missing else "")
                            + (f" (not commands: {' '.join(extra)})" if extra else ""))
    return problems


COMPLETIONS = [("bash", "completions/fencerun.bash"), ("zsh", "completions/_fencerun"), ("fish", "completions/fencerun.fish")]


def check_commands(fencerun, src):
    words, guards = table_commands(fencerun)
    problems = []
    for shell, path in COMPLETIONS:
        text = read(os.path.join(src, path))
        problems += command_problems(shell, path, text, words, guards)
        # The comparison notices a command missing from the file, or one the table does not have.
        for mutated in (re.sub(r"\bhistory\b", "histroy", text), re.sub(r"\bbump\b", "bum", text)):
            if not command_problems(shell, path, mutated, words, guards):
                sys.exit(f"the check of {path} does not notice a renamed command: is the check right?")
    if problems:
        print("The shell completions do not list the commands of `fencerun --help`:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)
    print(f"{len(words)} commands and {len(guards)} fence guards ({' '.join(words)}; {' '.join(guards)}): "
          f"every list of them in the bash, zsh and fish completions is the same")


def emitted_events(src):
    """Event names passed to log::event() anywhere under src/."""
    names = set()
    for root, _, files in os.walk(os.path.join(src, "src")):
        for f in files:
            if not f.endswith(".cpp"):
                continue
            text = read(os.path.join(root, f))
            for m in re.finditer(r"log::event\(", text):
                name = re.search(r'"([a-z_]+)"', text[m.end():m.end() + 200])
                if name:
                    names.add(name.group(1))
    return names


def check_events(fencerun, src):
    man = read(os.path.join(src, "man", "fencerun.1.adoc"))
    section = re.search(r"^== LOG EVENTS\n(.*?)^== ", man, re.S | re.M)
    if not section:
        sys.exit("man/fencerun.1.adoc has no LOG EVENTS section")
    listed = set()
    for heads in re.findall(r"^(\*[a-z_]+\*(?:, \*[a-z_]+\*)*) \(", section.group(1), re.M):
        listed.update(re.findall(r"\*([a-z_]+)\*", heads))
    emitted = emitted_events(src)
    if len(emitted) < 10:
        sys.exit(f"found only {len(emitted)} events in src/: {sorted(emitted)}; is the scan right?")
    problems = [f"event '{e}' is emitted but not listed under LOG EVENTS" for e in sorted(emitted - listed)]
    problems += [f"event '{e}' is listed under LOG EVENTS but never emitted" for e in sorted(listed - emitted)]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    print(f"{len(emitted)} events, all listed in the man page")


def main():
    modes = {"options": check_options, "golden": check_golden, "complete": check_complete,
             "events": check_events, "commands": check_commands}
    if len(sys.argv) != 4 or sys.argv[1] not in modes:
        sys.exit(__doc__)
    mode, fencerun, src = sys.argv[1:]
    modes[mode](fencerun, src)


if __name__ == "__main__":
    main()
