# bash completion for fencerun                                  -*- shell-script -*-

_fencerun()
{
    local cur prev words cword split
    _init_completion -s || return

    local i subcommand=""
    # Everything after `--` is the command to run: complete it as a command line of its own.
    for ((i = 1; i < cword; i++)); do
        if [[ ${words[i]} == -- ]]; then
            _command_offset $((i + 1))
            return
        fi
    done

    case $prev in
        --kill-signal)
            COMPREPLY=($(compgen -W 'HUP INT QUIT KILL TERM USR1 USR2 ALRM ABRT PIPE CONT STOP TSTP WINCH' -- "${cur#SIG}"))
            return
            ;;
        --log-format)
            COMPREPLY=($(compgen -W 'text json' -- "$cur"))
            return
            ;;
        -r | --redis)
            COMPREPLY=($(compgen -W 'redis:// rediss:// unix://' -- "$cur"))
            compopt -o nospace
            return
            ;;
        -w | --wait)
            COMPREPLY=($(compgen -W '0 10s 1m 10m inf' -- "$cur"))
            return
            ;;
        -t | --ttl | --renew | --grace | --timeout | -E | --conflict-exit-code | \
            --lease-lost-exit-code | --key-prefix)
            # A value of the user's own: nothing to offer.
            return
            ;;
    esac
    [[ $split == true ]] && return

    # The subcommand is the first word that is not an option or an option's value.
    for ((i = 1; i < cword; i++)); do
        case ${words[i]} in
            -r | --redis | -t | --ttl | --renew | --grace | --kill-signal | -w | --wait | -E | \
                --conflict-exit-code | --lease-lost-exit-code | --timeout | --key-prefix | --log-format)
                ((i++))
                ;;
            -*) ;;
            *)
                subcommand=${words[i]}
                break
                ;;
        esac
    done

    local common='-r --redis --timeout --key-prefix -v --verbose -q --quiet --log-format -h --help'
    local run_opts='-t --ttl --renew --grace --kill-signal -w --wait -E --conflict-exit-code
        --lease-lost-exit-code --shell'

    if [[ $cur == -* ]]; then
        case $subcommand in
            status) COMPREPLY=($(compgen -W "$common --json" -- "$cur")) ;;
            run) COMPREPLY=($(compgen -W "$common $run_opts --" -- "$cur")) ;;
            "") COMPREPLY=($(compgen -W "$common $run_opts --version --" -- "$cur")) ;;
            *) COMPREPLY=($(compgen -W "--" -- "$cur")) ;;
        esac
        [[ ${COMPREPLY-} == *= ]] && compopt -o nospace
        return
    fi

    if [[ -z $subcommand ]]; then
        COMPREPLY=($(compgen -W 'run status' -- "$cur"))
    fi
    # Otherwise a lock NAME is expected: those live in Redis, so nothing is offered.
} &&
    complete -F _fencerun fencerun

# ex: filetype=sh
