# bash completion for fencerun                                  -*- shell-script -*-

# The schemes of a server URL (-r, --server, --redis): Redis's, then etcd's (fence redis: Redis's).
__fencerun_redis_schemes='redis:// rediss:// unix:// redis+sentinel:// rediss+sentinel://'
__fencerun_schemes="$__fencerun_redis_schemes etcd:// etcds://"

# True when option $1 takes a value in the next word.
__fencerun_takes_value()
{
    case $1 in
        -r | --server | --redis | -t | --ttl | --renew | --grace | --kill-signal | -w | --wait | -E | \
            --conflict-exit-code | --lease-lost-exit-code | --timeout | --key-prefix | --log-format | \
            --metrics-file | --min-replicas | --replica-timeout | --limit | --tls-ca-file | --tls-cert | \
            --tls-key | --tls-server-name | --token | --resource | --owner | --above | --min-interval | \
            --every | --slot-offset | --if-record-lost | --lock-delay | --skip-exit-code | --records-ttl | \
            --keep-runs | -n | --count)
            return 0
            ;;
    esac
    return 1
}

_fencerun()
{
    local cur prev words cword split
    _init_completion -s || return

    # The subcommand (or, without one, the lock NAME) is the first word that is not an option or an
    # option's value; everything after `--` is the command to run.
    local i subcommand="" sub_at=0 dashdash=0
    for ((i = 1; i < cword; i++)); do
        if [[ ${words[i]} == -- ]]; then
            dashdash=$i
            break
        fi
        if [[ -z $subcommand ]]; then
            if __fencerun_takes_value "${words[i]}"; then
                ((i++))
            elif [[ ${words[i]} != -* ]]; then
                subcommand=${words[i]}
                sub_at=$i
            fi
        fi
    done

    if [[ $subcommand == fence ]]; then
        _fencerun_fence
        return
    fi

    if ((dashdash > 0)); then
        _command_offset $((dashdash + 1))
        return
    fi

    case $prev in
        --kill-signal)
            COMPREPLY=($(compgen -W 'HUP INT QUIT KILL TERM USR1 USR2 ALRM ABRT PIPE CONT STOP TSTP WINCH' -- "${cur#SIG}"))
            return
            ;;
        --log-format)
            COMPREPLY=($(compgen -W 'text json' -- "$cur"))
            return
            ;;
        --if-record-lost)
            COMPREPLY=($(compgen -W 'run skip' -- "$cur"))
            return
            ;;
        -r | --server | --redis)
            # Redis (one server, Sentinel, a Cluster node) or an etcd cluster; -r given 3, 5 or 7
            # times is quorum mode.
            COMPREPLY=($(compgen -W "$__fencerun_schemes" -- "$cur"))
            compopt -o nospace
            return
            ;;
        -w | --wait)
            COMPREPLY=($(compgen -W '0 10s 1m 10m inf' -- "$cur"))
            return
            ;;
        --limit)
            # A whole number from 1 to 1024; offer a few.
            COMPREPLY=($(compgen -W '1 2 3 4 8 16' -- "$cur"))
            return
            ;;
        --metrics-file | --tls-ca-file | --tls-cert | --tls-key)
            _filedir
            return
            ;;
        --tls-server-name)
            _known_hosts_real -- "$cur"
            return
            ;;
        -t | --ttl | --renew | --grace | --timeout | -E | --conflict-exit-code | \
            --lease-lost-exit-code | --key-prefix | --min-replicas | --replica-timeout | --owner | --above | \
            --min-interval | --every | --slot-offset | --lock-delay | --skip-exit-code | --records-ttl | \
            --keep-runs | -n | --count)
            # A value of the user's own: nothing to offer.
            return
            ;;
    esac
    [[ $split == true ]] && return

    local connection='-r --server --redis --timeout --key-prefix --tls-ca-file --tls-cert --tls-key
        --tls-server-name --tls-insecure -v --verbose -q --quiet --log-format -h --help'
    local run_opts='-t --ttl --renew --grace --kill-signal -w --wait --fair --limit -E --conflict-exit-code
        --lease-lost-exit-code --shell --metrics-file --min-replicas --replica-timeout --min-interval
        --every --slot-offset --if-record-lost --lock-delay --skip-exit-code --records-ttl --keep-runs'

    if [[ $cur == -* ]]; then
        case $subcommand in
            status) COMPREPLY=($(compgen -W "$connection --json" -- "$cur")) ;;
            list) COMPREPLY=($(compgen -W "$connection --all --json" -- "$cur")) ;;
            break) COMPREPLY=($(compgen -W "$connection --owner -y --yes" -- "$cur")) ;;
            bump) COMPREPLY=($(compgen -W "$connection --above" -- "$cur")) ;;
            history) COMPREPLY=($(compgen -W "$connection -n --count --json --utc --all" -- "$cur")) ;;
            acl) COMPREPLY=($(compgen -W "--key-prefix --delex --delifeq --admin -v --verbose -q --quiet --log-format -h --help" -- "$cur")) ;;
            run) COMPREPLY=($(compgen -W "$connection $run_opts --" -- "$cur")) ;;
            "") COMPREPLY=($(compgen -W "$connection $run_opts --version --" -- "$cur")) ;;
            *) COMPREPLY=($(compgen -W "--" -- "$cur")) ;;
        esac
        [[ ${COMPREPLY-} == *= ]] && compopt -o nospace
        return
    fi

    if [[ -z $subcommand ]]; then
        COMPREPLY=($(compgen -W 'run status list break bump history acl fence help' -- "$cur"))
    elif [[ $subcommand == help && $sub_at -eq $((cword - 1)) ]]; then
        COMPREPLY=($(compgen -W 'run status list break bump history acl fence' -- "$cur"))
    fi
    # Otherwise a lock NAME (or list's PATTERN) is expected: those live in Redis, so nothing is offered.
}

# fencerun fence file|redis|sql ...: the resource-side guards.
_fencerun_fence()
{
    local guard="" j
    for ((j = sub_at + 1; j < cword; j++)); do
        [[ ${words[j]} == -- ]] && break
        if [[ -z $guard && ${words[j]} != -* ]]; then
            guard=${words[j]}
            break
        fi
    done

    if [[ -z $guard ]]; then
        COMPREPLY=($(compgen -W 'file redis sql --help' -- "$cur"))
        return
    fi
    # After `--` comes a Redis command (fence redis): nothing to offer.
    ((dashdash > 0)) && return

    case $prev in
        -r | --server | --redis)
            # The fence key lives on a Redis server (not etcd).
            COMPREPLY=($(compgen -W "$__fencerun_redis_schemes" -- "$cur"))
            compopt -o nospace
            return
            ;;
        --token | --timeout | --key-prefix | --resource | --tls-server-name)
            return
            ;;
        --tls-ca-file | --tls-cert | --tls-key)
            _filedir
            return
            ;;
        --log-format)
            COMPREPLY=($(compgen -W 'text json' -- "$cur"))
            return
            ;;
    esac
    [[ $split == true ]] && return

    case $guard in
        file)
            if [[ $cur == -* ]]; then
                COMPREPLY=($(compgen -W '--token --read -v --verbose -q --quiet --log-format --help' -- "$cur"))
            else
                _filedir
            fi
            ;;
        redis)
            COMPREPLY=($(compgen -W '-r --server --redis --timeout --key-prefix --tls-ca-file --tls-cert --tls-key
                --tls-server-name --tls-insecure -v --verbose -q --quiet --log-format --resource --token
                --help --' -- "$cur"))
            ;;
        sql)
            if [[ $cur == -* ]]; then
                COMPREPLY=($(compgen -W '-v --verbose -q --quiet --log-format --help' -- "$cur"))
            else
                COMPREPLY=($(compgen -W 'postgresql postgres mysql mariadb sqlite' -- "$cur"))
            fi
            ;;
    esac
}

complete -F _fencerun fencerun

# ex: filetype=sh
