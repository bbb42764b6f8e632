# bash completion for kvctl (kvctl(8)); installed as
# share/bash-completion/completions/kvctl.

_kvctl()
{
	local cur prev words cword
	if declare -F _init_completion >/dev/null; then
		_init_completion || return
	else
		# Without the bash-completion package.
		words=("${COMP_WORDS[@]}")
		cword=$COMP_CWORD
		cur=${COMP_WORDS[COMP_CWORD]}
		prev=${COMP_WORDS[COMP_CWORD - 1]}
	fi

	local commands="status pools namespaces clients evict flush drain reload check metrics top events dump help"
	local global="-s --socket -o --output -h --help -V --version"

	case $prev in
	-s|--socket)
		if declare -F _filedir >/dev/null; then
			_filedir
		else
			COMPREPLY=($(compgen -f -- "$cur"))
		fi
		return
		;;
	-o|--output)
		COMPREPLY=($(compgen -W "human json" -- "$cur"))
		return
		;;
	--pool)
		# Pool ids from the daemon, when it answers.
		local ids
		ids=$("${words[0]}" -o json pools 2>/dev/null |
		      sed -n 's/.*"pool_id": \([0-9]*\).*/\1/p')
		COMPREPLY=($(compgen -W "$ids" -- "$cur"))
		return
		;;
	--tier)
		COMPREPLY=($(compgen -W "g1 g2 g3" -- "$cur"))
		return
		;;
	--timeout|-n|--count|-d|--delay|--endpoint|--replay-endpoint|--from|--topic)
		return
		;;
	esac

	local i cmd=
	for ((i = 1; i < cword; i++)); do
		case ${words[i]} in
		-s|--socket|-o|--output|--pool|--tier|--timeout|-n|--count|-d|--delay|--endpoint|--replay-endpoint|--from|--topic)
			((i++))
			;;
		-*)
			;;
		*)
			cmd=${words[i]}
			break
			;;
		esac
	done

	if [[ -z $cmd ]]; then
		if [[ $cur == -* ]]; then
			COMPREPLY=($(compgen -W "$global" -- "$cur"))
		else
			COMPREPLY=($(compgen -W "$commands" -- "$cur"))
		fi
		return
	fi

	local opts="-s --socket -o --output -h --help"
	case $cmd in
	evict) opts+=" --tier --pool --all" ;;
	drain) opts+=" --timeout --wait" ;;
	top) opts+=" -n --count -d --delay" ;;
	events) opts+=" --endpoint --topic --replay-endpoint --from -n --count" ;;
	help)
		COMPREPLY=($(compgen -W "${commands% help}" -- "$cur"))
		return
		;;
	esac
	COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -F _kvctl kvctl
